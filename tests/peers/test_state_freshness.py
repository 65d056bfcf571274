"""A replan never hands a stage stale or no state (geotrain.peers.worker, "where the initial weights come from").

Real workers of one-stage plans on loopback transports. *Stale* state is state stamped with a step
before the plan's start step: what a spare kept from a plan it sat out while the others trained on.
A peer re-placed after sitting a plan out fetches its group's state instead of adopting its own stale
copy; donors of stale state are refused; a peer new to the job (no previous plan) asks the plan's
spares too, since the holders the plan left out are spares now.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from geotrain.config import JobSpec, job_from_dict
from geotrain.errors import StateLostError, StateTransferError
from geotrain.peers.worker import StageWorker
from geotrain.plan import JobPlan, StageSlot
from geotrain.sync.state import StageState, digest, fetch_state, serve_state
from geotrain.transport import Transport

JOB = "fresh"


@pytest.fixture(scope="module")
def job() -> JobSpec:
    return job_from_dict({
        "job": {"name": "fresh", "seed": 0},
        "model": {"preset": "tiny"},
        "data": {"max_bytes": 1 << 18},
        "pipeline": {"micro_batch_size": 2, "microbatches": 1},
        "sync": {"every": 5, "codec": "none"},
        "swarm": {"round_timeout_s": 5},
    })


@pytest.fixture
def net(net: Callable[..., Transport]) -> Callable[[str], Transport]:
    """The loopback transports of tests/conftest.py, every one in region ``eu``."""
    return lambda name: net(name, region="eu")


def _plan(job: JobSpec, version: int, peer: str, t: Transport, *, spares: tuple[str, ...] = (),
          start_step: int = 0) -> JobPlan:
    blocks = job.model.block_model(job.job.seed).num_blocks
    return JobPlan(job_id=JOB, version=version, num_blocks=blocks, sync_codec="none", spares=spares,
                   start_step=start_step,
                   pipelines=((StageSlot(peer=peer, start=0, end=blocks, endpoint=t.address, region="eu"),),))


def _state(job: JobSpec, t: Transport, *, step: int, shift: float) -> StageState:
    """A whole-model global state of ``step`` (round step / every): the seed's weights plus ``shift``."""
    w = StageWorker(job, _plan(job, 1, t.peer_id, t), peer_id=t.peer_id, transport=t)
    try:
        st = w.state()
    finally:
        w.close()
    params = {n: p + shift for n, p in st.params.items()}
    return StageState(JOB, step // job.sync.every, step, params, {n: torch.zeros_like(p) for n, p in params.items()})


def test_a_spare_placed_again_fetches_its_group_state_not_its_own_stale_copy(
    job: JobSpec, net: Callable[[str], Transport]
) -> None:
    t0, t1 = net("p0"), net("p1")
    stale = _state(job, t0, step=5, shift=0.5)  # p0's state when plan v2 made it a spare
    fresh = _state(job, t1, step=20, shift=0.25)  # p1 trained on under v2
    serve_state(t1, lambda: None, lambda: fresh)
    v2 = _plan(job, 2, "p1", t1, spares=("p0",), start_step=5)
    v3 = _plan(job, 3, "p0", t0, spares=("p1",), start_step=20)
    w = StageWorker(job, v3, peer_id="p0", transport=t0, previous_state=stale, previous_plan=v2)
    try:
        assert w.state_source == "peers"
        assert digest(w.state().params) == digest(fresh.params)
        assert w.round == 4
    finally:
        w.close()


def test_a_peer_new_to_the_job_asks_the_spares_the_plan_left_the_holders_as(
    job: JobSpec, net: Callable[[str], Transport]
) -> None:
    t0, t1 = net("p0"), net("p1")
    held = _state(job, t1, step=20, shift=0.25)
    serve_state(t1, lambda: None, lambda: held)
    plan = _plan(job, 2, "p0", t0, spares=("p1",), start_step=20)  # p1, the holder, is a spare now
    with pytest.raises(StateLostError):  # without the spares nobody is asked: the blocks look lost
        StageWorker(job, plan, peer_id="p0", transport=t0)
    t0.connect("p1", t1.address, region="eu")
    w = StageWorker(job, plan, peer_id="p0", transport=t0, spares=("p1",))
    try:
        assert w.state_source == "peers"
        assert digest(w.state().params) == digest(held.params)
    finally:
        w.close()


def test_stale_donors_are_refused_for_a_fresh_one(job: JobSpec, net: Callable[[str], Transport]) -> None:
    old, new, joiner = net("old"), net("new"), net("joiner")
    stale, fresh = _state(job, old, step=5, shift=0.5), _state(job, new, step=20, shift=0.25)
    serve_state(old, lambda: None, lambda: stale)
    serve_state(new, lambda: None, lambda: fresh)
    joiner.connect("old", old.address)
    joiner.connect("new", new.address)
    names = sorted(fresh.params)
    got = fetch_state(joiner, ["old", "new"], job_id=JOB, start=0, end=99, need=names, timeout=5.0, min_step=20)
    assert digest(got.params) == digest(fresh.params) and got.step == 20
    with pytest.raises(StateTransferError, match="stale state of step 5"):
        fetch_state(joiner, ["old"], job_id=JOB, start=0, end=99, need=names, timeout=5.0, min_step=20)
    # without a lower bound (a caller that takes any committed state) the first donor's is taken
    assert fetch_state(joiner, ["old"], job_id=JOB, start=0, end=99, need=names, timeout=5.0).step == 5


def test_a_donor_is_told_the_plan_its_asker_follows(job: JobSpec, net: Callable[[str], Transport]) -> None:
    # a donor a replan moved out, whose news was lost, hears of the new plan from the first state request
    t0, t1 = net("p0"), net("p1")
    held = _state(job, t1, step=20, shift=0.25)
    told: list[tuple[str, int]] = []
    serve_state(t1, lambda: None, lambda: held, newer=lambda job_id, version: told.append((job_id, version)))
    t0.connect("p1", t1.address, region="eu")
    w = StageWorker(job, _plan(job, 4, "p0", t0, spares=("p1",), start_step=20), peer_id="p0", transport=t0,
                    spares=("p1",))
    try:
        assert w.state_source == "peers"
        assert told and set(told) == {(JOB, 4)}
    finally:
        w.close()


def test_a_plan_numbered_past_its_state_floor_adopts_state_from_the_floor_on_and_numbers_on(
    job: JobSpec, net: Callable[[str], Transport]
) -> None:
    # the replan of a swarm whose peers reported steps 17 and 33: numbering goes on at 30, state from 15 on
    t0, t1 = net("p0"), net("p1")
    kept = _state(job, t0, step=17, shift=0.5)
    v2 = replace(_plan(job, 2, "p0", t0, start_step=30), state_step=15)
    w = StageWorker(job, v2, peer_id="p0", transport=t0, previous_state=kept, previous_plan=_plan(job, 1, "p0", t0))
    try:
        assert w.state_source == "own" and digest(w.state().params) == digest(kept.params)
        assert w.state().step == 30  # the numbering never goes back below the furthest peer's
    finally:
        w.close()
    held = _state(job, t1, step=17, shift=0.25)  # a donor of the slower group: from the floor on, so taken
    serve_state(t1, lambda: None, lambda: held)
    t0.connect("p1", t1.address, region="eu")
    w = StageWorker(job, replace(v2, spares=("p1",)), peer_id="p0", transport=t0, spares=("p1",))
    try:
        assert w.state_source == "peers" and digest(w.state().params) == digest(held.params)
    finally:
        w.close()
    older = replace(v2, state_step=20, spares=("p1",))  # a floor past the donor's step: refused as stale
    with pytest.raises(StateLostError, match="step 20"):
        StageWorker(job, older, peer_id="p0", transport=t0, spares=("p1",))


def _two_pipelines(job: JobSpec, version: int, ts: dict[str, Transport], *, start_step: int) -> JobPlan:
    """One stage, two pipelines: ``ts``' two peers form one stage group."""
    blocks = job.model.block_model(job.job.seed).num_blocks
    return JobPlan(job_id=JOB, version=version, num_blocks=blocks, sync_codec="none", start_step=start_step,
                   pipelines=tuple((StageSlot(peer=p, start=0, end=blocks, endpoint=t.address, region="eu"),)
                                   for p, t in ts.items()))


def test_a_group_starts_a_replan_from_its_newest_round_when_the_start_step_lags(
    job: JobSpec, net: Callable[[str], Transport]
) -> None:
    # the replan's start step (10) came from records that lagged: p0 had committed round 3 at step 15 already,
    # p1 was at step 13 on round 2. Each adopting its own would average pseudo-gradients of two global models
    t0, t1 = net("p0"), net("p1")
    ahead = replace(_state(job, t0, step=15, shift=0.25), round=3)
    behind = replace(_state(job, t1, step=13, shift=0.5), round=2)
    serve_state(t0, lambda: None, lambda: ahead)
    serve_state(t1, lambda: None, lambda: behind)
    ts = {"p0": t0, "p1": t1}
    v1, v2 = _two_pipelines(job, 1, ts, start_step=0), _two_pipelines(job, 2, ts, start_step=10)
    w1 = StageWorker(job, v2, peer_id="p1", transport=t1, previous_state=behind, previous_plan=v1)
    try:
        assert w1.state_source == "peers" and w1.round == 3
        assert digest(w1.state().params) == digest(ahead.params)
        assert w1.head(JOB, 0, 1) == (3, 10) and w1.head("another job", 0, 1) is None
    finally:
        w1.close()
    w0 = StageWorker(job, v2, peer_id="p0", transport=t0, previous_state=ahead, previous_plan=v1)
    try:  # the member ahead keeps its own: nobody holds a newer round
        assert w0.state_source == "own" and w0.round == 3
        assert digest(w0.state().params) == digest(ahead.params)
    finally:
        w0.close()


def test_a_member_that_cannot_fetch_the_newer_round_starts_from_its_own(
    job: JobSpec, net: Callable[[str], Transport]
) -> None:
    t0, t1 = net("p0"), net("p1")
    behind = replace(_state(job, t1, step=13, shift=0.5), round=2)
    # p0 says it holds round 3 but serves no state: a lie or a crash between the two requests
    t0.serve("state.head", lambda m: type(m)(kind="state.head.ok", meta={"round": 3, "step": 15}))
    ts = {"p0": t0, "p1": t1}
    v1, v2 = _two_pipelines(job, 1, ts, start_step=0), _two_pipelines(job, 2, ts, start_step=10)
    w1 = StageWorker(job, v2, peer_id="p1", transport=t1, previous_state=behind, previous_plan=v1)
    try:
        assert w1.state_source == "own" and w1.round == 2
        assert digest(w1.state().params) == digest(behind.params)
    finally:
        w1.close()


def test_state_head_answers_round_and_step_and_refuses_malformed_asks(
    job: JobSpec, net: Callable[[str], Transport]
) -> None:
    from geotrain.sync.state import HEAD_KIND, state_heads
    from geotrain.transport import Message

    t0, t1 = net("p0"), net("p1")
    held = replace(_state(job, t1, step=15, shift=0.25), round=3)
    serve_state(t1, lambda: None, lambda: held)
    t0.connect("p1", t1.address, region="eu")
    good = {"job_id": JOB, "start": 0, "end": 1}
    for bad in ({**good, "start": "0"}, {**good, "end": True}, {**good, "start": 1, "end": 1},
                {**good, "job_id": 7}, {**good, "plan_version": 2.5}, {}):
        reply = t0.request("p1", Message(kind=HEAD_KIND, meta=bad), timeout=5.0)
        assert reply.kind == HEAD_KIND + ".err" and not reply.tensors, bad
    reply = t0.request("p1", Message(kind=HEAD_KIND, meta={**good, "job_id": "other"}), timeout=5.0)
    assert reply.kind == HEAD_KIND + ".err"
    reply = t0.request("p1", Message(kind=HEAD_KIND, meta=good), timeout=5.0)
    assert reply.kind == HEAD_KIND + ".ok" and reply.meta == {"round": 3, "step": 15} and not reply.tensors
    # the asker's side: every holder at once, one that never answers left out after the timeout
    silent = net("p2")
    t0.connect("p2", silent.address, region="eu")
    assert state_heads(t0, ["p1", "p2"], job_id=JOB, start=0, end=1, timeout=1.0) == {"p1": (3, 15)}
