"""A peer with several local ranks (``--nproc-per-node``): one inner step equals one rank's; a dead rank is an error.

The ranks here are gloo processes on the CPU, as ``geotrain peer --nproc-per-node 2 --device cpu`` starts them.
An SGD step makes a difference in the gradients visible in the weights at their own scale (AdamW's first
steps are about ``lr * sign(g)``: a gradient near zero would flip its sign on a rounding difference).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import torch

from geotrain.config import ModelSection
from geotrain.errors import ConfigError, LocalRankError
from geotrain.peers.ranks import LocalRanks, resolve_devices, split_sizes
from geotrain.pipeline import StageConfig
from geotrain.pipeline.local import LocalPipeline

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

SECTION = ModelSection(preset="tiny")
MODEL = SECTION.block_model(0)
BATCH = torch.randint(0, 256, (6, SECTION.context + 1), generator=torch.Generator().manual_seed(1))
CONFIG = StageConfig(job="j", stage=0, num_stages=1, microbatches=2, lr=1e-3)


def test_rows_are_split_near_equally_and_devices_resolve() -> None:
    assert split_sizes(5, 2) == [3, 2] and split_sizes(1, 3) == [1, 0, 0] and sum(split_sizes(17, 4)) == 17
    assert resolve_devices("cpu", 2) == ("cpu", "cpu") and resolve_devices("cpu", 1) == ()
    assert resolve_devices("cpu", None, "cuda:0,cuda:1") == ("cuda:0", "cuda:1")
    assert resolve_devices("cpu", None, "cuda:1") == ("cuda:1",)  # one named device: one rank there
    with pytest.raises(ConfigError, match="names 2"):
        resolve_devices("cpu", 3, "cuda:0,cuda:1")
    with pytest.raises(ConfigError, match="--devices"):
        resolve_devices("cuda:1", 2)
    with pytest.raises(ConfigError, match="distinct"):
        LocalRanks(["cuda:0", "cuda:0"])


@pytest.fixture(scope="module")
def ranks() -> Iterator[LocalRanks]:
    r = LocalRanks(["cpu", "cpu"], timeout_s=30, threads=1).start()
    try:
        yield r
    finally:
        r.close()


def _train(layers: list[tuple[int, int]], local: dict[int, tuple[LocalRanks, ModelSection]] | None = None,
           steps: int = 2) -> tuple[dict[str, torch.Tensor], list[float]]:
    losses = []
    with LocalPipeline(MODEL, layers, CONFIG, seed=0, data=lambda step: BATCH, local=local,
                       optimizer=lambda st: torch.optim.SGD(st.parameters(), lr=0.5)) as pp:
        for step in range(steps):
            loss = pp.step(step)[-1].loss
            assert loss is not None
            losses.append(loss)
        weights = {f"{s}:{n}": p.detach().clone() for s, st in enumerate(pp.stages) for n, p in st.named_parameters()}
    return weights, losses


@pytest.mark.parametrize("layers, spread", [
    ([(0, MODEL.num_blocks)], 0),  # the whole model on one peer: first and last stage at once
    ([(0, 2), (2, MODEL.num_blocks)], 0),  # a first stage: token ids in, activations out
    ([(0, 2), (2, MODEL.num_blocks)], 1),  # a last stage: activations in (their gradients back), the loss out
], ids=["whole", "first", "last"])  # fmt: skip
def test_two_ranks_take_the_same_steps_as_one(ranks: LocalRanks, layers: list[tuple[int, int]], spread: int) -> None:
    one, loss_one = _train(layers)
    before = ranks.bytes_moved
    two, loss_two = _train(layers, {spread: (ranks, SECTION)})
    assert ranks.bytes_moved > before  # the helper did take part
    assert loss_two == pytest.approx(loss_one, abs=1e-5)
    assert set(one) == set(two)
    worst = max(float((one[n] - two[n]).abs().max()) for n in one)
    assert worst < 1e-5, worst


def test_a_microbatch_smaller_than_the_ranks_is_computed_by_those_it_reaches(ranks: LocalRanks) -> None:
    global BATCH
    saved = BATCH
    BATCH = saved[:2]  # 2 microbatches of 1 row: the helper gets none
    try:
        one, _ = _train([(0, MODEL.num_blocks)], steps=1)
        two, _ = _train([(0, MODEL.num_blocks)], {0: (ranks, SECTION)}, steps=1)
    finally:
        BATCH = saved
    assert max(float((one[n] - two[n]).abs().max()) for n in one) < 1e-5


def test_a_dead_rank_is_a_local_rank_error_at_once_not_a_hang() -> None:
    # the collectives' timeout is past this test's: only a closed connection or pipe can raise in time
    r = LocalRanks(["cpu", "cpu"], timeout_s=600, threads=1).start()
    try:
        with LocalPipeline(MODEL, [(0, MODEL.num_blocks)], CONFIG, seed=0, data=lambda step: BATCH,
                           local={0: (r, SECTION)}) as pp:
            pp.step(0)
            os.kill(r.pids()[0], signal.SIGKILL)
            with pytest.raises(LocalRankError, match="local rank 1 is gone"):
                pp.step(1)
            assert not r.alive()
    finally:
        r.close()


def test_a_rank_killed_between_the_command_and_the_transfer_is_a_local_rank_error() -> None:
    # a kill that lands mid-step: the helper took its command, then died. gloo posts a send or receive at
    # once and raises a bare RuntimeError on the closed connection, before any wait
    r = LocalRanks(["cpu", "cpu"], timeout_s=600, threads=1).start()
    try:
        os.kill(r.pids()[0], signal.SIGKILL)
        assert r._procs[0].wait(timeout=30) == -signal.SIGKILL
        with pytest.raises(LocalRankError, match="local rank 1 is gone .*send failed"):
            r._send(torch.zeros(4), 1)
        with pytest.raises(LocalRankError, match="local rank 1 is gone .*receive failed"):
            r._recv((4,), torch.float32, 1, torch.device("cpu"))
    finally:
        r.close()
