"""Pipelines cut at different boundaries train together: stage groups form by block segment.

Two pipelines of the tiny GPT (6 blocks): pipeline A cut at 3 (p0 [0, 3), p1 [3, 6)), pipeline B cut at 2
(p2 [0, 2), p3 [2, 6)). The segments are [0, 2) {p0, p2}, [2, 3) {p0, p3} and [3, 6) {p1, p3}: p0 and p3
each take part in two segments' rounds. Four real StageWorkers on loopback transports, one thread each,
run two rounds; every segment's members then hold bitwise equal global parameters, and training moved them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from geotrain.config import JobSpec, job_from_dict
from geotrain.peers.worker import StageWorker
from geotrain.plan import JobPlan, StageSlot
from geotrain.transport import Transport, TransportConfig

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def job() -> JobSpec:
    return job_from_dict({
        "job": {"name": "mixed", "seed": 5},
        "model": {"preset": "tiny"},
        "data": {"max_bytes": 1 << 18},
        "pipeline": {"micro_batch_size": 2, "microbatches": 2},
        "sync": {"every": 2, "codec": "none"},
        "swarm": {"round_timeout_s": 20, "hop_timeout_s": 20},
    })


@pytest.fixture
def transports() -> Iterator[dict[str, Transport]]:
    ts = {p: Transport(TransportConfig(), peer_id=p, region="eu").start() for p in ("p0", "p1", "p2", "p3")}
    try:
        yield ts
    finally:
        for t in ts.values():
            t.close()


def test_pipelines_with_different_boundaries_keep_each_segment_in_step(
    job: JobSpec, transports: dict[str, Transport]
) -> None:
    blocks = job.model.block_model(job.job.seed).num_blocks
    assert blocks == 6

    def slot(peer: str, start: int, end: int) -> StageSlot:
        return StageSlot(peer=peer, start=start, end=end, endpoint=transports[peer].address, region="eu")

    plan = JobPlan(job_id="mixed", version=1, num_blocks=blocks, sync_codec="none",
                   pipelines=((slot("p0", 0, 3), slot("p1", 3, 6)), (slot("p2", 0, 2), slot("p3", 2, 6))))
    segments = [(g.start, g.end, g.members) for g in plan.sync_groups()]
    assert segments == [(0, 2, ("p0", "p2")), (2, 3, ("p0", "p3")), (3, 6, ("p1", "p3"))]
    workers = {p: StageWorker(job, plan, peer_id=p, transport=t) for p, t in transports.items()}
    initial = {p: {n: t.clone() for n, t in w.state().params.items()} for p, w in workers.items()}
    errors: list[BaseException] = []

    def train(w: StageWorker) -> None:
        try:
            for step in range(4):  # rounds after steps 2 and 4
                w.step(step)
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=train, args=(w,)) for w in workers.values()]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=100)
        assert not any(th.is_alive() for th in threads), "a worker hung"
        assert not errors, errors
        states = {p: w.state() for p, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
    for start, end, members in segments:
        pieces = [states[m].select(start, end).params for m in members]
        assert pieces[0] and set(pieces[0]) == set(pieces[1]), (start, end)
        for name in pieces[0]:
            assert torch.equal(pieces[0][name], pieces[1][name]), (start, end, name)
        moved = [not torch.equal(pieces[0][n], initial[members[0]][n]) for n in pieces[0]]
        assert all(moved), (start, end, sum(moved), len(moved))  # two outer steps moved every tensor
        assert all(states[m].round == 2 for m in members), [(m, states[m].round) for m in members]
