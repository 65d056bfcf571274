"""A member SIGKILLed mid-round: survivors finish (or discard) the round in time and stay bit-identical."""

from __future__ import annotations

import signal

import pytest

from geotrain.local.procs import ChildGroup
from geotrain.sync import Member, RoundId, RoundRoles
from geotrain.transport import Message, Transport, TransportConfig

FLOOR = 2.0


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_sigkilled_leader_mid_round(children: ChildGroup) -> None:
    spec = [("p0", "eu"), ("p1", "eu"), ("p2", "us"), ("p3", "us")]
    procs = {
        pid: children.start(pid, ["--peer-id", pid, "--region", region, "--floor", str(FLOOR)],
                            module="tests.sync.member_proc")
        for pid, region in spec
    }
    members = [Member(pid, region, procs[pid].wait_event("ready", 60)["address"]) for pid, region in spec]
    roles = RoundRoles.build(members, RoundId(0, 2), hierarchical=True)
    # kill the leader that is not the coordinator: its region's other member must learn the result by asking
    victim = next(m.peer_id for m in roles.leaders.values() if m.peer_id != roles.coordinator.peer_id)
    with Transport(TransportConfig(), peer_id="test", region="ctl").start() as ctl:
        for m in members:
            ctl.connect(m.peer_id, m.address)
            ctl.send(m.peer_id, Message("test.members", meta={"members": [[x.peer_id, x.region, x.address] for x in members]}),
                     timeout=10)
        procs[victim].wait_event("round_start", 60)
        procs[victim].wait_event("round_start", 60)  # round 2 has begun
        children.kill(procs[victim], signal.SIGKILL)
        survivors = [pid for pid, _ in spec if pid != victim]
        rounds = {pid: [procs[pid].wait_event("round", 60) for _ in range(3)] for pid in survivors}
        for pid in survivors:
            ctl.send(pid, Message("test.stop"), timeout=10)
    for r in range(3):
        shas = {rounds[pid][r]["global_sha"] for pid in survivors}
        assert len(shas) == 1, (r, {pid: rounds[pid][r] for pid in survivors})
        assert len({rounds[pid][r]["committed"] for pid in survivors}) == 1
    second = [rounds[pid][1] for pid in survivors]
    assert all(x["seconds"] < 2 * FLOOR + 2.0 for x in second), second
    if second[0]["committed"]:
        assert all(victim not in x["contributors"] for x in second) or all(victim in x["contributors"] for x in second)
    assert all(x["committed"] for x in rounds[survivors[0]][:1])
