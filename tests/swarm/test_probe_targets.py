"""Link probes scale: a peer measures a few peers of its region and representatives of the others, not everyone."""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import Any

import pytest

from geotrain.swarm.probe_targets import LOCAL_TARGETS, PER_REGION_TARGETS, probe_targets


def _swarm(n: int, regions: int) -> dict[str, str]:
    return {f"peer-{i:02d}": f"r{i % regions}" for i in range(n)}


def test_targets_are_a_few_local_peers_and_representatives_of_every_region() -> None:
    view = _swarm(16, 4)
    indegree: collections.Counter[str] = collections.Counter()
    for me, region in view.items():
        targets = probe_targets(me, view)
        assert me not in targets and len(targets) == len(set(targets))
        assert len(targets) <= LOCAL_TARGETS + PER_REGION_TARGETS * 3 < 15
        by_region = collections.Counter(view[t] for t in targets)
        assert set(by_region) == {"r0", "r1", "r2", "r3"}  # every region pair gets a measured figure
        assert by_region[region] == min(LOCAL_TARGETS, 3)
        assert all(c == PER_REGION_TARGETS for r, c in by_region.items() if r != region)
        assert targets == probe_targets(me, dict(reversed(list(view.items()))))  # same view, same answer
        indegree.update(targets)
    assert max(indegree.values()) < 15  # representatives differ between probers: nobody is probed by all


def test_the_probe_count_does_not_grow_with_the_swarm() -> None:
    counts = {n: max(len(probe_targets(me, _swarm(n, 4))) for me in _swarm(n, 4)) for n in (8, 32, 256)}
    assert counts[32] == counts[256] == LOCAL_TARGETS + PER_REGION_TARGETS * 3
    assert probe_targets("stranger", _swarm(8, 2)) == []


def test_a_joining_peer_of_a_swarm_of_16_probes_its_targets_not_15(monkeypatch: pytest.MonkeyPatch) -> None:
    import geotrain.peers.agent as agent_mod
    from geotrain.peers.agent import AgentConfig, PeerAgent
    from geotrain.peers.probe import LinkMeasurement

    view = _swarm(16, 4)
    me = "peer-00"
    records = {pid: SimpleNamespace(region=r, endpoint=f"tcp://127.0.0.1:{5000 + i}", curve_public_key=None,
                                    started_at=100.0 + i, dial_back=False)
               for i, (pid, r) in enumerate(view.items())}
    published: list[Any] = []
    swarm = SimpleNamespace(peer_id=me, admission=None, config=SimpleNamespace(record_ttl_s=30.0, links_lifetime_s=30.0),
                            get_peers=lambda **kw: records, get_jobs=lambda **kw: {}, publish_links=published.append)
    connected: list[str] = []
    transport = SimpleNamespace(config=SimpleNamespace(curve=None), dial_out=False,
                                connect=lambda pid, endpoint, **kw: connected.append(pid))
    probed: list[str] = []

    def fake_measure(transport: Any, pid: str, config: Any) -> LinkMeasurement:
        probed.append(pid)
        return LinkMeasurement(src=me, dst=pid, bandwidth_bps=1e7, rtt_s=0.01, measured_at=1.0, probe_bytes=1)

    monkeypatch.setattr(agent_mod, "measure_link", fake_measure)
    agent = PeerAgent(AgentConfig(region="r0"), swarm=swarm, transport=transport)  # type: ignore[arg-type]
    agent._started = 1000.0  # the joiner: every other peer was there before it
    agent._probe_once()
    assert sorted(probed) == probe_targets(me, view)
    assert len(probed) == LOCAL_TARGETS + PER_REGION_TARGETS * 3 and len(probed) < 15
    assert set(published[-1].links) == set(probed)

    # the same peer as the oldest of the swarm: the others measure their pairs with it, it probes nobody
    probed.clear()
    old = PeerAgent(AgentConfig(region="r0"), swarm=swarm, transport=transport)  # type: ignore[arg-type]
    old._started = 1.0
    assert old._probe_once() is False and probed == []


def test_the_younger_peer_of_a_pair_measures_it() -> None:
    view = _swarm(32, 4)
    started = {pid: float(i) for i, pid in enumerate(sorted(view))}
    targets = {me: probe_targets(me, view, started=started) for me in view}
    for me, ts in targets.items():
        assert all(started[t] < started[me] for t in ts)  # only older peers
    measured = {frozenset((me, t)) for me, ts in targets.items() for t in ts}
    assert sum(len(ts) for ts in targets.values()) == len(measured)  # no pair is probed from both sides
    # the newest peer probes its full set, as without ages; the oldest probes nobody
    newest, oldest = max(view, key=started.__getitem__), min(view, key=started.__getitem__)
    assert targets[newest] == probe_targets(newest, view) and targets[oldest] == []
    # a new peer costs O(regions + k) probes, not O(N): nobody else probes it
    joiner = "peer-new"
    view2, started2 = {**view, joiner: "r1"}, {**started, joiner: 99.0}
    assert all(joiner not in probe_targets(me, view2, started=started2) for me in view)
    assert len(probe_targets(joiner, view2, started=started2)) == LOCAL_TARGETS + PER_REGION_TARGETS * 3


def test_status_shows_unmeasured_pairs_as_estimated_from_their_regions() -> None:
    from geotrain.cli.status import estimated_links

    peers = [{"peer_id": p, "region": r} for p, r in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b"))]
    links = [{"src": "a1", "dst": "b1", "bandwidth_bps": 1e6, "rtt_s": 0.1},
             {"src": "a2", "dst": "b2", "bandwidth_bps": 3e6, "rtt_s": 0.3},
             {"src": "a1", "dst": "a2", "bandwidth_bps": 1e8, "rtt_s": 0.001}]
    est = {(e["src"], e["dst"]): e for e in estimated_links(peers, links)}
    assert ("a1", "b2") in est and est[("a1", "b2")]["bandwidth_bps"] == 2e6 and est[("a1", "b2")]["rtt_s"] == 0.2
    assert ("a1", "b1") not in est and ("b1", "a1") not in est  # measured in one direction: not estimated
    assert ("b1", "b2") not in est  # region b's own link: nobody measured a pair inside b, so no figure


def test_a_peer_nobody_can_dial_is_no_target_and_probes_its_targets_whatever_their_age() -> None:
    view = _swarm(16, 4)
    started = {pid: float(i) for i, pid in enumerate(sorted(view))}
    oldest = min(view, key=started.__getitem__)
    nat = {oldest}  # behind NAT: the others cannot dial it, so it measures its pairs itself
    assert probe_targets(oldest, view, started=started, dial_out=nat) == probe_targets(oldest, view)
    assert all(oldest not in probe_targets(me, view, started=started, dial_out=nat) for me in view)


def test_the_followed_coordinator_stays_on_the_allow_list_when_a_quick_read_misses_its_job() -> None:
    from geotrain.peers.agent import AgentConfig, PeerAgent
    from geotrain.swarm.news import Contact

    allowed: list[set[bytes]] = []
    swarm = SimpleNamespace(peer_id="me", admission=object(), config=SimpleNamespace(record_ttl_s=30.0),
                            get_jobs=lambda **kw: {})  # this read missed the job record
    transport = SimpleNamespace(config=SimpleNamespace(curve=object()), allow_clients=allowed.append)
    agent = PeerAgent(AgentConfig(region="r0"), swarm=swarm, transport=transport)  # type: ignore[arg-type]
    member = SimpleNamespace(curve_public_key="member-key")
    agent._refresh_allow_list({"m": member})  # type: ignore[dict-item]
    assert allowed[-1] == {b"member-key"}
    agent._coordinator = Contact("coord", "tcp://127.0.0.1:1", curve_public_key="coord-key")
    agent._refresh_allow_list({"m": member})  # type: ignore[dict-item]
    assert allowed[-1] == {b"member-key", b"coord-key"}


def test_a_coordinator_the_watcher_reads_first_wakes_the_allow_list_refresh() -> None:
    from geotrain.peers.agent import AgentConfig, PeerAgent
    from tests.coordinator.test_job_e2e import tiny_job

    job = SimpleNamespace(job_id="j", spec=tiny_job(steps=5), endpoint="tcp://127.0.0.1:1", curve_public_key="coord-key",
                          published_at=1.0, plan_version=None, plan_stop_step=None)
    allowed: list[set[bytes]] = []
    swarm = SimpleNamespace(peer_id="me", admission=object(), config=SimpleNamespace(record_ttl_s=30.0),
                            get_jobs=lambda **kw: {}, latest_plan=lambda **kw: None)
    transport = SimpleNamespace(config=SimpleNamespace(curve=object()), allow_clients=allowed.append, dial_out=False)
    agent = PeerAgent(AgentConfig(region="r0"), swarm=swarm, transport=transport)  # type: ignore[arg-type]
    swarm.get_jobs = lambda **kw: {"coord": job}  # the watcher's read finds the job; the probe loop's did not
    assert agent._current() is None and agent._view_now.is_set()
    agent._view_now.clear()
    swarm.get_jobs = lambda **kw: {}
    agent._refresh_allow_list({})
    assert allowed[-1] == {b"coord-key"}
    swarm.get_jobs = lambda **kw: {"coord": job}
    agent._current()
    assert not agent._view_now.is_set()  # admitted already: no wake-up at every poll
