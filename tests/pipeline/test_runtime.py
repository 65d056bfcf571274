"""The stage runtime over real loopback transports, one thread per stage (see geotrain.pipeline.local)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from geotrain.data import DataConfig, TokenDataset, build_dataset
from geotrain.errors import ConfigError, PlanSupersededError, StageFailedError
from geotrain.models import GPTConfig, GPTModel, build_stage, even_split
from geotrain.pipeline import LocalPipeline, StageConfig, StageRuntime
from geotrain.transport import Message, Transport, TransportConfig

TINY = GPTConfig.preset("tiny")
SEED = 11
BATCH = 8
MBS = 4


@pytest.fixture(scope="module")
def dataset() -> TokenDataset:
    return build_dataset(DataConfig(max_bytes=512 << 10))


def _data(ds: TokenDataset, cfg: GPTConfig = TINY) -> Callable[[int], torch.Tensor]:
    return lambda step: ds.get_batch(step, batch_size=BATCH, seq_len=cfg.seq_len, seed=SEED)


def _reference(cfg: GPTConfig, data: Callable[[int], torch.Tensor], steps: int, *, lr: float = 3e-4):
    """Single-process training of the whole model on the same microbatches: (losses, grads of step 0)."""
    full = build_stage(GPTModel(cfg), (0, cfg.num_blocks), SEED)
    opt = torch.optim.AdamW(full.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    losses, first_grads = [], {}
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in data(step).chunk(MBS):
            loss = full.loss(full(mb[:, :-1]), mb[:, 1:])
            total += float(loss.detach()) / MBS
            (loss / MBS).backward()
        if step == 0:
            first_grads = {n: p.grad.clone() for n, p in full.named_parameters()}
        losses.append(total)
        opt.step()
    return losses, first_grads


def _config(**kw) -> StageConfig:
    base = dict(job="test-job", stage=0, num_stages=3, microbatches=MBS, hop_timeout_s=20.0)
    return StageConfig(**{**base, **kw})


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("targets_from_first", [False, True])
def test_three_stages_equal_single_process_training(dataset, schedule: str, targets_from_first: bool) -> None:
    data = _data(dataset)
    ref_losses, ref_grads = _reference(TINY, data, steps=3)
    layers = [(0, 2), (2, 4), (4, 6)]
    cfg = _config(schedule=schedule, targets_from_first=targets_from_first)
    with LocalPipeline(GPTModel(TINY), layers, cfg, seed=SEED, data=data) as pp:
        loss0 = pp.forward_backward(0)
        grads = pp.named_grads()
        assert set(grads) == set(ref_grads) | {"blocks.5.lm_head.weight"}
        for name, g in grads.items():
            ref = ref_grads["blocks.0.wte.weight" if name == "blocks.5.lm_head.weight" else name]
            torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-5, msg=name)
        assert loss0 == pytest.approx(ref_losses[0], abs=1e-5)
        for rt in pp.runtimes:
            rt.optimizer.step()  # finish step 0 as run_inner_step would
            rt.optimizer.zero_grad(set_to_none=True)
        metrics = [pp.step(s) for s in (1, 2)]
    for s, per_stage in zip((1, 2), metrics, strict=True):
        assert per_stage[-1].loss == pytest.approx(ref_losses[s], abs=1e-5)
        assert [m.loss for m in per_stage[:-1]] == [None, None]
    # both copies of the tied embedding got the same summed gradient and stayed equal
    first, last = pp.stages[0].blocks["0"].wte.weight, pp.stages[-1].blocks["5"].lm_head.weight
    assert torch.equal(first, last)


def test_untied_two_stage_pipeline_matches(dataset) -> None:
    cfg = GPTConfig.preset("tiny", tie_embeddings=False)
    data = _data(dataset, cfg)
    ref_losses, _ = _reference(cfg, data, steps=2)
    with LocalPipeline(GPTModel(cfg), [(0, 3), (3, 6)], _config(num_stages=2), seed=SEED, data=data) as pp:
        assert all(rt.tied == [] for rt in pp.runtimes)
        losses = [pp.step(s)[-1].loss for s in range(2)]
    assert losses == pytest.approx(ref_losses, abs=1e-5)


def test_int8_activations_stay_within_two_percent_after_50_steps(dataset) -> None:
    data = _data(dataset)
    layers = even_split(TINY.num_blocks, 3)
    val = dataset.val_batches(batch_size=32, seq_len=TINY.seq_len, num_batches=4)
    final, bytes_act = {}, {}
    for codec in ("none", "int8"):
        cfg = _config(schedule="1f1b", lr=1e-3)
        with LocalPipeline(
            GPTModel(TINY), layers, cfg, seed=SEED, data=data, codecs=[(codec, codec), (codec, codec)]
        ) as pp:
            history = [pp.step(s) for s in range(50)]
            final[codec] = pp.evaluate(50, val)  # over the hops, with the codec under test
            with torch.no_grad():  # the same, chained in this process without codecs
                losses = []
                for b in val:
                    x = b[:, :-1]
                    for st in pp.stages:
                        x = st(x)
                    losses.append(float(pp.stages[-1].loss(x, b[:, 1:])))
            assert final[codec] == pytest.approx(sum(losses) / len(losses), rel=1e-3 if codec == "int8" else 1e-6)
        bytes_act[codec] = history[-1][0].bytes_sent["pp-s1"]
        assert final[codec] < history[0][-1].loss - 1.0  # it learned something
    assert abs(final["int8"] - final["none"]) / final["none"] < 0.02, final
    assert bytes_act["int8"] < 0.35 * bytes_act["none"], bytes_act


def test_metrics_account_for_time_and_bytes(dataset) -> None:
    with LocalPipeline(GPTModel(TINY), even_split(TINY.num_blocks, 3), _config(), seed=SEED, data=_data(dataset)) as pp:
        pp.step(0)
        first, middle, last = pp.step(1)
    act_bytes = BATCH * TINY.seq_len * TINY.d_model * 4  # fp32 activations of the whole batch
    assert first.bytes_sent["pp-s1"] >= act_bytes
    assert middle.bytes_recv["pp-s0"] >= act_bytes and middle.bytes_recv["pp-s2"] >= act_bytes
    assert first.bytes_sent["pp-s2"] > 0 and last.bytes_recv["pp-s0"] > 0  # tied gradient exchange
    for m in (first, middle, last):
        assert 0 < m.compute_s <= m.wall_s and 0.0 <= m.bubble_fraction < 1.0
        assert m.tokens in (0, BATCH * TINY.seq_len)
        assert m.to_json()["step"] == 1


def test_a_silent_neighbour_raises_the_typed_timeout_within_the_deadline(dataset) -> None:
    # stage 1 never runs: stage 0 waits for gradients, stage 2 for activations
    timeout = 1.5
    with LocalPipeline(
        GPTModel(TINY), even_split(TINY.num_blocks, 3), _config(hop_timeout_s=timeout), seed=SEED, data=_data(dataset)
    ) as pp:
        errors: dict[int, BaseException] = {}
        took: dict[int, float] = {}

        def run(s: int) -> None:
            t0 = time.monotonic()
            try:
                pp.runtimes[s].run_inner_step(7)
            except StageFailedError as e:
                errors[s] = e
            took[s] = time.monotonic() - t0

        threads = [threading.Thread(target=run, args=(s,)) for s in (0, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
    for s in (0, 2):
        err = errors[s]
        assert isinstance(err, StageFailedError) and err.peer == "pp-s1" and err.step == 7, err
        assert "pp-s1" in str(err) and "step 7" in str(err)
        assert took[s] >= timeout  # it waited its hop timeout out (the join above bounds it from above)
        # a failed step leaves no partial gradient behind
        assert all(p.grad is None for p in pp.stages[s].parameters())


def test_a_wait_on_a_silent_neighbour_gives_up_when_a_newer_plan_is_published(dataset) -> None:
    # stage 1 never runs; the hop timeout is far away: only interrupt() can end stage 0's wait for gradients
    with LocalPipeline(
        GPTModel(TINY), even_split(TINY.num_blocks, 3), _config(hop_timeout_s=600.0), seed=SEED, data=_data(dataset)
    ) as pp:
        before = [p.detach().clone() for p in pp.runtimes[0].stage.parameters()]
        waiting = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            waiting.set()
            try:
                pp.runtimes[0].run_inner_step(3)
            except StageFailedError as e:
                errors.append(e)

        t = threading.Thread(target=run)
        t.start()
        assert waiting.wait(30)
        pp.runtimes[0].interrupt("plan v2 was published")
        t.join(timeout=60)
        assert not t.is_alive()
    (err,) = errors
    assert isinstance(err, PlanSupersededError) and err.peer == "pp-s1" and err.step == 3, err
    assert "plan v2 was published" in str(err)
    # nothing of the step was applied
    assert all(torch.equal(a, b) for a, b in zip(before, pp.runtimes[0].stage.parameters(), strict=True))


def test_foreign_and_stale_messages_are_dropped_and_counted(dataset) -> None:
    data = _data(dataset)
    with LocalPipeline(GPTModel(TINY), [(0, 3), (3, 6)], _config(num_stages=2), seed=SEED, data=data) as pp:
        rogue = Transport(TransportConfig(), peer_id="rogue").start()
        try:
            rogue.connect("pp-s1", pp.transports[1].address)
            junk = {"x": torch.zeros(BATCH // MBS, TINY.seq_len, TINY.d_model)}
            # wrong job, wrong plan version, right job but not the expected sender: all "foreign"
            for job, plan in (("other-job", 0), ("test-job", 5), ("test-job", 0)):
                rogue.send("pp-s1", Message(kind="pp.act", tag=(0, 3, 0), job=job, plan_version=plan, step=3,
                                            tensors=junk), timeout=5)
            # a leftover of an older step from the right peer: "stale"
            pp.transports[0].send("pp-s1", Message(kind="pp.act", tag=(0, 1, 0), job="test-job", step=1,
                                                   tensors=junk), timeout=5)
            full = build_stage(GPTModel(TINY), (0, TINY.num_blocks), SEED)
            with torch.no_grad():
                ref = sum(float(full.loss(full(mb[:, :-1]), mb[:, 1:])) for mb in data(3).chunk(MBS)) / MBS
            # the rogue messages are queued ahead of the real ones for the same tag
            pp.transports[1].wait_stats(lambda s: s.recv_messages >= 4, timeout=10)
            _, last = pp.step(3)
        finally:
            rogue.close()
    assert last.loss == pytest.approx(ref, abs=1e-5)  # the junk changed nothing
    assert last.dropped == {"foreign": 3, "stale": 1}


def test_runtime_config_errors(dataset) -> None:
    with pytest.raises(ConfigError, match="stage must be in"):
        StageConfig(job="j", stage=3, num_stages=3)
    with pytest.raises(ConfigError, match="pipeline.job"):
        StageConfig(job="", stage=0, num_stages=1)
    with Transport(TransportConfig(), peer_id="x").start() as t:
        stage = build_stage(TINY, (0, 2), SEED)
        with pytest.raises(ConfigError, match="config says stage"):
            StageRuntime(_config(stage=1), stage=stage, transport=t, prev_peer="a", next_peer="b")
        with pytest.raises(ConfigError, match="needs data"):
            StageRuntime(_config(), stage=stage, transport=t, next_peer="b", end_peer="c")
        with pytest.raises(ConfigError, match="end_peer"):
            StageRuntime(_config(), stage=stage, transport=t, next_peer="b", data=_data(dataset))


def test_single_stage_pipeline_needs_no_network(dataset) -> None:
    data = _data(dataset)
    ref_losses, _ = _reference(TINY, data, steps=2)
    with LocalPipeline(GPTModel(TINY), [(0, TINY.num_blocks)], _config(num_stages=1), seed=SEED, data=data) as pp:
        losses = [pp.step(s)[0].loss for s in range(2)]
    assert losses == pytest.approx(ref_losses, abs=1e-6)


def test_validation_loss_over_the_hops(dataset) -> None:
    val = dataset.val_batches(batch_size=4, seq_len=TINY.seq_len, num_batches=3)
    full = build_stage(GPTModel(TINY), (0, TINY.num_blocks), SEED)
    with torch.no_grad():
        ref = sum(float(full.loss(full(b[:, :-1]), b[:, 1:])) for b in val) / len(val)
    cfg = _config(targets_from_first=True)
    with LocalPipeline(GPTModel(TINY), even_split(TINY.num_blocks, 3), cfg, seed=SEED, data=_data(dataset)) as pp:
        assert pp.evaluate(0, val) == pytest.approx(ref, abs=1e-5)
        pp.step(0)
        assert pp.evaluate(1, val) < ref  # one step of training moved it
