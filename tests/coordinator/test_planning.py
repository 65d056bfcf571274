"""The live planner's scenario carries what the runtime will do (geotrain.coordinator.planning)."""

from __future__ import annotations

import time

import pytest

from geotrain.config import job_from_dict
from geotrain.coordinator.planning import scenario_dict
from geotrain.planner.scenario import Scenario
from geotrain.swarm.records import JobRecord, PeerRecord


def _peer(pid: str, region: str) -> PeerRecord:
    now = time.time()
    return PeerRecord(peer_id=pid, region=region, device="cpu", flops=1e12, memory_bytes=2**34, usd_per_hour=1.0,
                      endpoint="tcp://127.0.0.1:5555", version="0.1", started_at=now, heartbeat_at=now)


@pytest.mark.parametrize("intra", ["none", "int8"])
def test_scenario_prices_the_intra_region_leg_with_the_jobs_intra_codec(intra: str) -> None:
    job = job_from_dict({"job": {"name": "t"}, "model": {"preset": "tiny"}, "sync": {"intra_codec": intra}})
    peers = {"QmA": _peer("QmA", "eu"), "QmB": _peer("QmB", "us")}
    d = scenario_dict(job, peers, {})
    assert d["job"]["sync_intra_codec"] == intra
    assert Scenario.from_dict(d).job.sync_intra_codec == intra


def test_job_record_endpoint_must_be_a_tcp_address() -> None:
    ok = JobRecord(job_id="j", spec={}, published_at=time.time(), endpoint="tcp://10.0.0.1:4000")
    assert ok.endpoint == "tcp://10.0.0.1:4000"
    with pytest.raises(ValueError, match="tcp://"):
        JobRecord(job_id="j", spec={}, published_at=time.time(), endpoint="ipc:///tmp/x; rm -rf /")


def test_the_live_scenario_keeps_each_measured_direction_and_region_medians() -> None:
    import time

    from geotrain.config import job_from_dict
    from geotrain.coordinator.planning import scenario_dict
    from geotrain.planner import Scenario
    from geotrain.swarm.records import LinkMeasurement, LinkRow
    from tests.swarm.test_records import peer_record

    now = time.time()
    peers = {p: peer_record(p, region=r) for p, r in (("home", "de"), ("a100", "us"), ("a100b", "us"))}

    def row(src: str, **to: tuple[float, float]) -> LinkRow:
        return LinkRow(src=src, links={d: LinkMeasurement(bandwidth_bps=bw, rtt_s=rtt, measured_at=now)
                                       for d, (bw, rtt) in to.items()})

    links = {"home": row("home", a100=(25e6, 0.09)),  # a home uplink: 200 Mbit/s up ...
             "a100": row("a100", home=(125e6, 0.09), a100b=(1.25e9, 0.001))}  # ... 1 Gbit/s down
    sc = scenario_dict(job_from_dict({}), peers, links)
    by = {(e["a"], e["b"]): e for e in sc["links"]}
    assert by[("home", "a100")]["bandwidth_gbps"] == pytest.approx(0.2)
    assert by[("a100", "home")]["bandwidth_gbps"] == pytest.approx(1.0)
    assert by[("a100", "a100b")]["bandwidth_gbps"] == pytest.approx(10.0)  # measured one way: both ways
    assert {("de", "us"), ("us", "de"), ("us", "us")} <= set(by)  # region medians, per direction
    Scenario.from_dict(sc)  # the planner takes it


def test_a_figure_from_real_traffic_replaces_the_probes_for_its_direction_only() -> None:
    from geotrain.coordinator.planning import with_passive
    from geotrain.swarm.records import LinkMeasurement, LinkRow

    t0 = time.time()
    probed = LinkMeasurement(bandwidth_bps=5e6, rtt_s=0.02, measured_at=t0)
    links = {"QmA": LinkRow(src="QmA", links={"QmB": probed}), "QmC": LinkRow(src="QmC", links={"QmA": probed})}
    out = with_passive(links, {("QmA", "QmB"): (1e4, t0 + 10),   # degraded after the probe: replaces it
                               ("QmB", "QmA"): (2e4, t0 + 10),   # measured by probe the other way: RTT borrowed
                               ("QmA", "QmC"): (3e4, t0 - 10),   # no probe this way (only QmC -> QmA): added
                               ("QmB", "QmD"): (4e4, t0 + 10)})  # never probed either way: left out
    assert out["QmA"].links["QmB"] == LinkMeasurement(bandwidth_bps=1e4, rtt_s=0.02, measured_at=t0 + 10)
    assert out["QmB"].links["QmA"].bandwidth_bps == 2e4 and out["QmB"].links["QmA"].rtt_s == 0.02
    assert out["QmA"].links["QmC"].bandwidth_bps == 3e4
    assert "QmD" not in out["QmB"].links
    assert links["QmA"].links["QmB"] is probed  # the probes' rows themselves are not changed
    newer = {"QmA": LinkRow(src="QmA", links={"QmB": LinkMeasurement(bandwidth_bps=5e6, rtt_s=0.02,
                                                                      measured_at=t0 + 20)})}
    assert with_passive(newer, {("QmA", "QmB"): (1e4, t0 + 10)})["QmA"].links["QmB"].bandwidth_bps == 5e6


def test_hops_that_cross_the_same_region_pair_are_held_to_their_share_of_its_link() -> None:
    from geotrain.coordinator.coordinator import _fair_shares
    from geotrain.plan import JobPlan, StageSlot

    plan = JobPlan(job_id="j", version=1, num_blocks=2, stop_step=10, pipelines=(
        (StageSlot(peer="A1", start=0, end=1, region="us"), StageSlot(peer="B1", start=1, end=2, region="eu")),
        (StageSlot(peer="A2", start=0, end=1, region="us"), StageSlot(peer="B2", start=1, end=2, region="eu")),
        (StageSlot(peer="A3", start=0, end=1, region="us"), StageSlot(peer="A4", start=1, end=2, region="us")),
    ))
    hops = [["A1", "B1", 8e6], ["B1", "A1", 8e6], ["A2", "B2", 8e6], ["B2", "A2", 4e6],
            ["A3", "A4", 1e9], ["A4", "A3", 1e9]]
    shares = _fair_shares(plan, hops)
    assert shares[("A1", "B1")] == 4e6 and shares[("A2", "B2")] == 4e6  # two hops us -> eu split its link
    assert shares[("B2", "A2")] == 2e6  # ... and two eu -> us
    assert shares[("A3", "A4")] == 1e9  # inside a region: its own link


def test_news_of_a_replan_reaches_the_peers_it_moved_out_and_its_spares() -> None:
    # a peer of the old plan that is a spare in the new one trained on under the old plan for a whole watch
    # period (30 s) without this, while the new plan's members pulled their state from it
    from geotrain.coordinator.coordinator import news_contacts
    from geotrain.plan import JobPlan, StageSlot

    def slot(pid: str, start: int, end: int) -> StageSlot:
        return StageSlot(peer=pid, start=start, end=end, endpoint=f"tcp://127.0.0.1:{ord(pid[-1])}", region="us")

    old = JobPlan(job_id="j", version=1, num_blocks=2, pipelines=((slot("QmA", 0, 1), slot("QmB", 1, 2)),),
                  spares=("QmC",))
    new = JobPlan(job_id="j", version=2, num_blocks=2, pipelines=((slot("QmC", 0, 1), slot("QmD", 1, 2)),),
                  spares=("QmA", "QmB", "QmE"))
    records = {p: _peer(p, "us") for p in ("QmA", "QmB", "QmC", "QmD")}  # QmE: no record (yet): not reachable
    told = {c.peer_id: c.endpoint for c in news_contacts(new, old, records)}
    assert set(told) == {"QmA", "QmB", "QmC", "QmD"}
    assert told["QmA"] == "tcp://127.0.0.1:65"  # the plan's own slot, not the record's address
    assert {c.peer_id for c in news_contacts(new, None, records)} == {"QmA", "QmB", "QmC", "QmD"}  # spares too
    assert {c.peer_id for c in news_contacts(old, None, {})} == {"QmA", "QmB"}


def test_two_regions_nobody_measured_a_pair_of_are_priced_through_a_third() -> None:
    from geotrain.coordinator.planning import bridged_region_links

    figures = {("pub1", "home"): (4e7, 0.01), ("home", "pub2"): (2e7, 0.03), ("pub1", "cafe"): (1e7, 0.005),
               ("cafe", "pub2"): (1e7, 0.001)}
    # pub1-pub2 through home (2e7: its slower leg) beats through cafe (1e7); RTTs add up
    got = bridged_region_links(figures, ["pub1", "pub2", "home", "cafe"])
    assert got[("pub1", "pub2")] == (2e7, 0.01 + 0.03)
    assert got[("cafe", "home")] == (1e7, 0.005 + 0.01)  # through pub1 (1e7, 15 ms) beats pub2 (1e7, 31 ms)
    assert set(got) == {("pub1", "pub2"), ("cafe", "home")}  # measured pairs are not re-priced
    # a region with no measured pair to anyone stays without a link; a pair two hops apart gets one
    chain = bridged_region_links({("a", "b"): (1e8, 0.01), ("b", "c"): (1e8, 0.01), ("c", "d"): (5e7, 0.02)},
                                 ["a", "b", "c", "d", "lone"])
    assert chain[("a", "d")] == (5e7, 0.04) and not any("lone" in pair for pair in chain)


def test_a_stage_group_spanning_three_regions_plans_when_the_public_pair_was_never_measured() -> None:
    """Two public peers and two behind NAT in one stage group: every leg to the homes was measured, the one
    pair between the public regions (its probe refused while allow-lists caught up) was not."""
    import time

    from geotrain.config import job_from_dict
    from geotrain.coordinator.planning import make_plan
    from geotrain.peers.reachability import DIAL_BACK
    from geotrain.swarm.records import LinkMeasurement, LinkRow
    from tests.coordinator.test_job_e2e import tiny_job
    from tests.swarm.test_reachability import rec

    raw = tiny_job(steps=20)
    raw["pipeline"].update(stages=1, pipelines=4)
    peers = {"a": rec("a", region="pub1", endpoint="tcp://10.0.0.1:1", reachable=True),
             "b": rec("b", region="pub2", endpoint="tcp://10.0.0.2:1", reachable=True),
             "h1": rec("h1", region="home", endpoint=DIAL_BACK, reachable=False),
             "h2": rec("h2", region="home", endpoint=DIAL_BACK, reachable=False)}
    m = LinkMeasurement(bandwidth_bps=1e8, rtt_s=0.01, measured_at=time.time())
    links = {h: LinkRow(src=h, links={"a": m, "b": m}) for h in ("h1", "h2")}
    plan, _ = make_plan(job_from_dict(raw), "j", version=1, peers=peers, links=links)
    assert sorted(s.peer for pipe in plan.pipelines for s in pipe) == ["a", "b", "h1", "h2"]
