"""A swarm across real (namespace) networks: two public regions and a home peer behind NAT.

The home peer is started as a user at home would (its LAN address, DHT client mode, no
``--nat``): the reachability preflight must find that nobody can dial it, it must then dial
out, and a job must train with it in a pipeline and in rounds, while no packet ever goes
towards its private address. A peer bound to 0.0.0.0 with ``--announce`` of its namespace
address trains with the others. Two home peers in two NATed networks, in one stage group of a
closed swarm (CURVE), exchange through a relay peer the coordinator names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from geotrain.local.procs import ChildGroup
from geotrain.swarm.keys import generate_swarm_key
from geotrain.transport.addresses import DIAL_BACK, split_endpoint
from tests.emulate.nat_net import ADDR, NatNet, nat_unavailable

pytestmark = [
    pytest.mark.netns,
    pytest.mark.multiprocess,
    pytest.mark.timeout(480),
    pytest.mark.skipif(nat_unavailable() is not None, reason=str(nat_unavailable())),
]

JOB = """
[job]
name = "nat"
seed = 1

[model]
preset = "tiny"

[data]
max_bytes = 1048576

[pipeline]
stages = 2
pipelines = 2
micro_batch_size = 4
microbatches = 2

[sync]
every = 5
codec = "int8"

[stop]
steps = 20

[swarm]
min_peers = 4
wait_peers_s = 240
hop_timeout_s = 30
round_timeout_s = 30

[report]
eval_batches = 2
"""


@pytest.fixture
def net() -> Iterator[NatNet]:
    n = NatNet(f"nat{os.getpid() % 100000}").setup()
    try:
        yield n
    finally:
        n.close()


LOGS = Path(os.environ.get("GEOTRAIN_TEST_LOGS", "/tmp"))


def _peer(children: ChildGroup, net: NatNet, name: str, ns: str, region: str, maddrs: list[str], *extra: str):  # type: ignore[no-untyped-def]
    args = ["peer", "--initial-peers", *maddrs, "--region", region, "--threads", "1", "--heartbeat", "1",
            "--probe-every", "600", "--job", "natjob", *extra]
    return children.start(name, args, prefix=net.prefix(ns), stderr_path=str(LOGS / f"gt-nat-{name}.log"),
                          env={"GEOTRAIN_LOG_LEVEL": "INFO"})


def test_home_peer_behind_nat_trains_in_pipeline_and_rounds(children: ChildGroup, net: NatNet, tmp_path: Path) -> None:
    boot = children.start("dht", ["dht", "--host", ADDR["p1"], "--port", "31337"], prefix=net.prefix("p1"))
    maddrs = boot.wait_event("ready", 60)["maddrs"]
    assert all(f"/ip4/{ADDR['p1']}/tcp/31337/" in m for m in maddrs)

    a = _peer(children, net, "a", "p1", "pub1", maddrs, "--host", ADDR["p1"])
    a.wait_event("ready", 180)
    # bound to every interface, announcing its namespace address, with fixed ports
    b = _peer(children, net, "b", "p2", "pub2", maddrs, "--host", "0.0.0.0", "--announce", ADDR["p2"],
              "--port", "5000", "--dht-port", "4001")
    c = _peer(children, net, "c", "p2", "pub2", maddrs, "--host", ADDR["p2"])
    home = _peer(children, net, "home", "home", "home", maddrs, "--host", ADDR["home"], "--client-mode")

    b_reach = b.wait_event("reachability", 180)
    assert b_reach["reachable"] is True and b_reach["data_plane"]["advertised"] == [f"tcp://{ADDR['p2']}:5000"]
    assert b_reach["dht"]["advertised"] and all(f"/ip4/{ADDR['p2']}/tcp/4001/" in m for m in b_reach["dht"]["advertised"])
    reach = home.wait_event("reachability", 180)
    assert reach["reachable"] is False and reach["dial_out"] is True, reach
    assert reach["checked_by"] and reach["seen_from"] == [ADDR["gw"]]  # the NAT's address, not its own
    assert "--nat" in reach["fix"]
    ready = home.wait_event("ready", 180)
    assert ready["endpoint"] == DIAL_BACK and ready["reachable"] is False
    assert split_endpoint(b.wait_event("ready", 180)["endpoint"]) == (ADDR["p2"], 5000)
    c.wait_event("ready", 180)

    job = tmp_path / "nat.toml"
    job.write_text(JOB)
    run = children.start("run", ["run", str(job), "--json", "--initial-peers", *maddrs, "--host", ADDR["p1"],
                                 "--job-id", "natjob", "--report-dir", str(tmp_path / "report")],
                         prefix=net.prefix("p1"), stderr_path=str(LOGS / "gt-nat-run.log"))
    run.wait_event("report", 420)
    assert run.proc.wait(timeout=60) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    plan = report["plans"][-1]
    slots = {s["peer"]: s for pipe in plan["pipelines"] for s in pipe}
    assert ready["peer_id"] in slots, "the home peer must have a stage"
    assert slots[ready["peer_id"]]["endpoint"] == DIAL_BACK
    stats = report["peer_stats"][ready["peer_id"]]
    assert stats["steps"] == 20 and stats["rounds"] >= 20 // 5, stats  # in a pipeline and in its stage group
    val = [v for v in report["validation"] if v["loss"] is not None]
    assert val[-1]["loss"] < val[0]["loss"], val
    # nothing was ever sent towards the home peer's private address, from any public namespace
    assert net.private_dials() == {"p1": 0, "p2": 0, "rt": 0}


def test_two_home_peers_in_one_stage_group_exchange_through_a_relay_in_a_closed_swarm(
    children: ChildGroup, net: NatNet, tmp_path: Path
) -> None:
    key = generate_swarm_key(tmp_path / "swarm.key")
    boot = children.start("dht", ["dht", "--host", ADDR["p1"], "--port", "31337"], prefix=net.prefix("p1"))
    maddrs = boot.wait_event("ready", 60)["maddrs"]
    closed = ["--swarm-key", str(key)]
    a = _peer(children, net, "a", "p1", "pub1", maddrs, "--host", ADDR["p1"], *closed)
    a.wait_event("ready", 180)
    b = _peer(children, net, "b", "p2", "pub2", maddrs, "--host", ADDR["p2"], *closed)
    homes = [_peer(children, net, name, name, "home", maddrs, "--host", ADDR[name], "--nat", *closed)
             for name in ("home", "home2")]
    b.wait_event("ready", 180)
    ready = [h.wait_event("ready", 180) for h in homes]
    assert all(r["endpoint"] == DIAL_BACK for r in ready)

    job = tmp_path / "relay.toml"
    # one stage per pipeline: the four peers form one stage group, and the region "home" has two
    # members behind NAT, one of which leads it: every round goes through the relay both ways
    job.write_text(JOB.replace("stages = 2", "stages = 1").replace("pipelines = 2", "pipelines = 4"))
    run = children.start("run", ["run", str(job), "--json", "--initial-peers", *maddrs, "--host", ADDR["p1"],
                                 "--job-id", "natjob", "--report-dir", str(tmp_path / "report"), *closed],
                         prefix=net.prefix("p1"), stderr_path=str(LOGS / "gt-nat-run.log"))
    try:
        run.wait_event("report", 420)
    except (RuntimeError, TimeoutError):
        children.dump_stacks()  # each peer's threads into its log (LOGS/gt-nat-*.log)
        raise
    assert run.proc.wait(timeout=60) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    slots = {s["peer"]: s for pipe in report["plans"][-1]["pipelines"] for s in pipe}
    relays = {slots[r["peer_id"]]["endpoint"] for r in ready}
    assert len(relays) == 1 and relays != {DIAL_BACK}, relays  # both routed through the same relay peer
    (relayed,) = relays
    assert slots[relayed[len(DIAL_BACK):]]["endpoint"].startswith("tcp://")
    for r in ready:
        assert report["peer_stats"][r["peer_id"]]["rounds"] >= 20 // 5, report["peer_stats"][r["peer_id"]]
    val = [v for v in report["validation"] if v["loss"] is not None]
    assert val[-1]["loss"] < val[0]["loss"], val
    assert net.private_dials() == {"p1": 0, "p2": 0, "rt": 0}
