"""Faults inside a round: silent members, a silent coordinator, NaN from a member and from a hostile peer."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from geotrain.sync import Member, RoundId, RoundRoles
from geotrain.sync.payload import CARRIER
from geotrain.transport import Message, Transport, TransportConfig
from tests.sync.conftest import Group, exact_config, flat_params, seeded_model

REGIONS = ["eu", "eu", "us", "us"]
FLOOR = 1.0  # deadline floor: a round ends by 2 x this


def _perturb(group: Group) -> dict[str, torch.Tensor]:
    out = {}
    for i, peer in enumerate(group.peers):
        g = torch.Generator().manual_seed(7 + i)
        with torch.no_grad():
            for p in peer.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
        out[peer.peer_id] = flat_params(peer.model)
    return out


def _roles(group: Group) -> RoundRoles:
    members = [Member(p.peer_id, p.transport.region, p.transport.address) for p in group.peers]
    return RoundRoles.build(members, RoundId(0, 1), hierarchical=True)


def _pick(group: Group, role: str) -> str:
    roles = _roles(group)
    coordinator = roles.coordinator.peer_id
    leaders = {m.peer_id for m in roles.leaders.values()}
    if role == "coordinator":
        return coordinator
    if role == "leader":
        return sorted(leaders - {coordinator})[0]
    return sorted({p.peer_id for p in group.peers} - leaders)[0]


def _silence_one(group: Group, role: str) -> tuple[str, list, dict[str, torch.Tensor]]:
    group.build(REGIONS, exact_config(deadline_floor_s=FLOOR), seeded_model())
    locals_ = _perturb(group)
    silent = _pick(group, role)
    survivors = [p for p in group.peers if p.peer_id != silent]
    return silent, group.step_all(1, survivors), locals_


def _assert_identical(peers: list) -> None:
    first = peers[0].sync.global_flat()
    for p in peers:
        assert torch.equal(p.sync.global_flat(), first)


def test_silent_member_is_left_out_and_survivors_agree(group: Group) -> None:
    silent, outcomes, locals_ = _silence_one(group, "member")
    survivors = [p for p in group.peers if p.peer_id != silent]
    # left out by the round's own deadline (not by a transport timeout): its leader says so
    leader_out = outcomes[_index(survivors, _leader_of(group, silent))][0]
    assert "missed the gather deadline" in leader_out.excluded[silent], leader_out.excluded
    for out in outcomes:
        assert out[0].committed and silent not in out[0].contributors and len(out[0].contributors) == 3
    expected = torch.stack([v for k, v in locals_.items() if k != silent]).mean(0)
    torch.testing.assert_close(survivors[0].sync.global_flat(), expected, atol=1e-6, rtol=0)
    _assert_identical(survivors)


def test_silent_leader_region_learns_result_by_asking(group: Group) -> None:
    silent, outcomes, locals_ = _silence_one(group, "leader")
    survivors = [p for p in group.peers if p.peer_id != silent]
    silent_region = next(p.transport.region for p in group.peers if p.peer_id == silent)
    counted = sorted(p.peer_id for p in group.peers if p.transport.region != silent_region)
    for out in outcomes:
        assert out[0].committed, out[0].reason
        assert sorted(out[0].contributors) == counted
    # its group was left out by the round's offer deadline (the coordinator's view says so)
    assert any("missed the offer deadline" in out[0].excluded.get(silent, "") for out in outcomes), outcomes
    # the uncounted survivor applied the outer step and kept its own progress on top
    orphan = next(p for p in survivors if p.transport.region == silent_region)
    g0 = flat_params(seeded_model()())
    shift = orphan.sync.global_flat() - g0
    torch.testing.assert_close(flat_params(orphan.model), locals_[orphan.peer_id] + shift, atol=1e-6, rtol=0)
    _assert_identical(survivors)


def test_silent_coordinator_means_discard_everywhere(group: Group) -> None:
    silent, outcomes, locals_ = _silence_one(group, "coordinator")
    survivors = [p for p in group.peers if p.peer_id != silent]
    g0 = flat_params(seeded_model()())
    for peer, out in zip(survivors, outcomes, strict=True):
        assert not out[0].committed
        # given up by the round's own bound (twice the deadline floor), not by a transport timeout
        assert f"within {2 * FLOOR}s" in out[0].reason, out[0].reason
        assert torch.equal(peer.sync.global_flat(), g0)
        assert torch.equal(flat_params(peer.model), locals_[peer.peer_id])  # local progress kept
        assert peer.sync.stats.rounds_discarded == 1


def test_quorum_lost_round_is_discarded(group: Group) -> None:
    group.build(REGIONS, exact_config(deadline_floor_s=FLOOR, quorum=1.0), seeded_model())
    _perturb(group)
    silent = _pick(group, "member")
    outcomes = group.step_all(1, [p for p in group.peers if p.peer_id != silent])
    for out in outcomes:
        assert not out[0].committed and "quorum" in out[0].reason


def test_member_with_nan_weights_abstains_and_is_named(group: Group) -> None:
    group.build(REGIONS, exact_config(deadline_floor_s=FLOOR), seeded_model())
    locals_ = _perturb(group)
    bad = group.peers[_index(group, _pick(group, "member"))]
    with torch.no_grad():
        next(bad.model.parameters()).view(-1)[0] = float("nan")
    outcomes = group.step_all(1)
    for out in outcomes:
        assert out[0].committed and bad.peer_id not in out[0].contributors
    leader_out = outcomes[_index(group, _leader_of(group, bad.peer_id))][0]
    assert "NaN" in leader_out.excluded[bad.peer_id]
    expected = torch.stack([v for k, v in locals_.items() if k != bad.peer_id]).mean(0)
    torch.testing.assert_close(group.peers[0].sync.global_flat(), expected, atol=1e-6, rtol=0)


def test_hostile_nan_payload_is_excluded_and_sender_named(group: Group) -> None:
    hostile = Transport(TransportConfig(), peer_id="zz-hostile", region="eu").start()
    group.transports.append(hostile)
    extra = Member(hostile.peer_id, "eu", hostile.address)
    group.build(REGIONS, exact_config(deadline_floor_s=FLOOR, quorum=0.5), seeded_model(), extra=[extra])
    locals_ = _perturb(group)
    members = [Member(p.peer_id, p.transport.region, p.transport.address) for p in group.peers] + [extra]
    roles = RoundRoles.build(members, RoundId(0, 1), hierarchical=True)
    leader = roles.leaders["eu"]
    assert leader.peer_id != hostile.peer_id
    n = group.peers[0].sync.fragments[0].numel
    poison = torch.full((n,), float("nan"))
    hostile.connect(leader.peer_id, leader.address, region="eu")
    entry = {"codec": "none:allow_nonfinite=true", "meta": {"shape": [n], "dtype": "float32", "wire": "float32"}, "nbuf": 1}
    hostile.send(
        leader.peer_id,
        Message("sync.contrib", ("stage0", 0, 1), meta={"payload": entry}, tensors={"p.0": poison}),
        codec=CARRIER, timeout=5.0,
    )
    outcomes = group.step_all(1)
    leader_out = outcomes[_index(group, leader.peer_id)][0]
    assert leader_out.committed and hostile.peer_id not in leader_out.contributors
    assert "NaN" in leader_out.excluded[hostile.peer_id]
    expected = torch.stack(list(locals_.values())).mean(0)
    torch.testing.assert_close(group.peers[0].sync.global_flat(), expected, atol=1e-6, rtol=0)
    _assert_identical(group.peers)


def _index(group: Group | list, peer_id: str) -> int:
    peers = group if isinstance(group, list) else group.peers
    return [p.peer_id for p in peers].index(peer_id)


def _leader_of(group: Group, peer_id: str) -> str:
    roles = _roles(group)
    return roles.leaders[roles.group_of(peer_id)].peer_id


def test_the_commit_lock_is_free_while_a_round_waits(group: Group) -> None:
    # a peer's state (what a joiner pulls, what a checkpoint writes) is read under the commit lock; a round
    # waiting on a silent member must not hold it, or every reader waits out the round's deadline with it
    group.build(REGIONS, exact_config(deadline_floor_s=FLOOR), seeded_model())
    _perturb(group)
    silent = _pick(group, "member")
    survivors = [p for p in group.peers if p.peer_id != silent]
    futures = [group.pool.submit(p.sync.after_inner_step, 1) for p in survivors]
    # the rounds are under way once a surviving member (no leader) sent its contribution; they wait for the silent one
    leaders = {m.peer_id for m in _roles(group).leaders.values()}
    sender = next(p for p in survivors if p.peer_id not in leaders)
    sender.transport.wait_stats(lambda s: s.sent_messages > 0, timeout=FLOOR / 2)
    # a bounded wait on the lock, well inside the round's wait for the silent member (2 x FLOOR)
    taken = []
    for p in survivors:
        taken.append(p.sync.commit_lock.acquire(timeout=0.25 * FLOOR))
        if taken[-1]:
            p.sync.commit_lock.release()
    outcomes = [f.result(timeout=30) for f in futures]
    assert all(out[0].committed for out in outcomes)
    assert all(taken), taken


def test_a_coordinator_that_starts_the_round_late_is_waited_for_and_the_round_commits(group: Group) -> None:
    # rounds have no barrier: a coordinator slower between rounds (or one that learnt the last round by
    # asking) starts this one late. Its decision comes after the other leader's 0.6 D; had that leader given
    # up, the coordinator would count its offer and wait in vain for its shard: the round lost everywhere
    floor = 2.0
    late = 0.7 * floor
    group.build(REGIONS, exact_config(deadline_floor_s=floor), seeded_model())
    locals_ = _perturb(group)
    coordinator = group.peers[_index(group, _pick(group, "coordinator"))]
    started = threading.Event()
    futures = [group.pool.submit(p.sync.after_inner_step, 1) for p in group.peers if p is not coordinator]
    started.wait(late)  # the scenario: the coordinator reaches step 1 this much later than everyone else
    futures.insert(_index(group, coordinator.peer_id), group.pool.submit(coordinator.sync.after_inner_step, 1))
    outcomes = [f.result(timeout=30) for f in futures]
    for peer, out in zip(group.peers, outcomes, strict=True):
        assert out[0].committed, (peer.peer_id, out[0].reason)
        assert sorted(out[0].contributors) == sorted(p.peer_id for p in group.peers)
    expected = torch.stack(list(locals_.values())).mean(0)
    torch.testing.assert_close(group.peers[0].sync.global_flat(), expected, atol=1e-6, rtol=0)
    _assert_identical(group.peers)


def test_a_leader_silent_right_after_it_committed_is_noticed_while_its_member_waits(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    # a leader frozen or killed once it committed never sends its member the result, which the other region
    # holds. Waiting out 1.1 D put that member's region 1.1 D behind the other, and a skew past 0.7 D lost every
    # later round (each member times a round from its own start): the member pings its leader while it waits
    group.build(REGIONS, exact_config(deadline_floor_s=20.0), seeded_model())
    locals_ = _perturb(group)
    leader = group.peers[_index(group, _pick(group, "leader"))]
    runner = leader.sync.runner
    send = runner.send

    def silent_once_committed(peer: str, msg: Message, deadline: float) -> None:
        if msg.kind == "sync.final":
            leader.transport.close()  # its result stays here; it answers nothing any more
            return
        send(peer, msg, deadline)

    runner.send = silent_once_committed  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="geotrain.sync.round"):
        outcomes = group.step_all(1)
    for peer, out in zip(group.peers, outcomes, strict=True):
        assert out[0].committed, (peer.peer_id, out[0].reason)
        assert sorted(out[0].contributors) == sorted(locals_)
    member = next(p for p in group.peers if p is not leader and p.transport.region == leader.transport.region)
    # it asked the others once its leader stopped answering, not at its 1.1 D (22 s)
    assert any(f"leader {leader.peer_id}" in r.getMessage() and "stopped answering" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    _assert_identical(group.peers)
    assert member.sync.global_flat().equal(group.peers[0].sync.global_flat())
