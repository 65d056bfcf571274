"""`geotrain dht`, `geotrain status` and a plain `hivemind-dht` bootstrap, as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geotrain.local.procs import ChildGroup
from geotrain.swarm import LinkMeasurement, LinkRow, Swarm, SwarmConfig
from geotrain.swarm.identity import Identity

from .helpers import RawClient, listening_tcp_ports, nested_tuple_bytes, session_pids, wait_until
from .test_swarm_dht import FAST, peer_record

pytestmark = pytest.mark.multiprocess


def test_dht_ready_line_persistent_id_and_clean_sigterm(children: ChildGroup, tmp_path: Path) -> None:
    key = tmp_path / "boot.key"
    child = children.start("dht", ["dht", "--identity", str(key)])
    ready = child.wait_event("ready", 60)
    assert ready["peer_id"] == Identity.load_or_create(key).peer_id  # the key file names the node
    assert ready["maddrs"] and all(m.endswith("/p2p/" + ready["peer_id"]) for m in ready["maddrs"])
    helpers = wait_until(lambda: (p := session_pids(child.pid) - {child.pid}) and len(p) >= 2 and p, 10)
    assert listening_tcp_ports(helpers | {child.pid})  # p2pd is up and listening

    os.kill(child.pid, signal.SIGTERM)  # only the main process: it must take its helpers down itself
    assert child.proc.wait(timeout=30) == 0
    assert child.wait_event("stopped", 5)["peer_id"] == ready["peer_id"]
    wait_until(lambda: not session_pids(child.pid), 10)  # DHT process and p2pd are gone

    # restarted with the same key file: same peer id
    again = children.start("dht-again", ["dht", "--identity", str(key)])
    assert again.wait_event("ready", 60)["peer_id"] == ready["peer_id"]


def test_sigkilled_dht_takes_its_p2pd_along(children: ChildGroup) -> None:
    child = children.start("dht", ["dht"])
    child.wait_event("ready", 60)
    helpers = wait_until(lambda: (p := session_pids(child.pid) - {child.pid}) and len(p) >= 2 and p, 10)
    os.kill(child.pid, signal.SIGKILL)  # no handler runs in the main process
    child.proc.wait(timeout=10)
    wait_until(lambda: not (session_pids(child.pid) & helpers), 15)


def test_status_json_lists_live_peers_and_links(children: ChildGroup) -> None:
    boot = children.start("dht", ["dht"])
    maddrs = boot.wait_event("ready", 60)["maddrs"]
    cfg = SwarmConfig(initial_peers=tuple(maddrs), **FAST)  # type: ignore[arg-type]
    with Swarm(cfg) as a, Swarm(cfg) as b:
        a.start_heartbeat(lambda: peer_record(a.peer_id, region="eu-west"))
        b.start_heartbeat(lambda: peer_record(b.peer_id, region="us-east", flops=2e12))
        m = LinkMeasurement(bandwidth_bps=1.25e7, rtt_s=0.05, measured_at=time.time())
        assert a.publish_links(LinkRow(src=a.peer_id, links={b.peer_id: m}))

        def status() -> dict:
            out = subprocess.run(
                [sys.executable, "-m", "geotrain", "status", "--initial-peers", *maddrs, "--json"],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr[-2000:]
            return json.loads(out.stdout)

        snap = wait_until(
            lambda: (s := status()) and len(s["peers"]) == 2 and s["links"] and s, 60, interval=0.5
        )
        by_id = {p["peer_id"]: p for p in snap["peers"]}
        assert by_id[b.peer_id]["region"] == "us-east" and by_id[b.peer_id]["flops"] == 2e12
        assert all(0 <= p["heartbeat_age_s"] < 10 for p in snap["peers"])
        assert snap["links"] == [{"src": a.peer_id, "dst": b.peer_id, **m.to_wire()}]

        human = subprocess.run(
            [sys.executable, "-m", "geotrain", "status", "--initial-peers", *maddrs],
            capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        assert human.returncode == 0 and "us-east" in human.stdout and "100.0 / 50.00" in human.stdout


def test_plain_hivemind_bootstrap_works_and_a_poisoned_record_does_not_crash_readers(
    children: ChildGroup, tmp_path: Path
) -> None:
    key = tmp_path / "plain.key"
    ident = Identity.load_or_create(key)  # our key file is hivemind's identity format
    plain = children.start(
        "hivemind-dht",
        ["--identity_path", str(key), "--host_maddrs", "/ip4/127.0.0.1/tcp/0"],
        module="hivemind.hivemind_cli.run_dht",
    )
    # hivemind-dht prints no machine-readable ready line: find the port its p2pd listens on
    port = wait_until(lambda: listening_tcp_ports(session_pids(plain.pid)), 60)
    maddr = f"/ip4/127.0.0.1/tcp/{min(port)}/p2p/{ident.peer_id}"
    cfg = SwarmConfig(initial_peers=(maddr,), **FAST)  # type: ignore[arg-type]
    with Swarm(cfg) as publisher:
        honest = peer_record(publisher.peer_id)
        publisher.start_heartbeat(lambda: honest)

        attacker = RawClient([maddr])
        try:
            soon = time.time() + 30
            sub, val = attacker.signed("geotrain_peers", attacker.owner_subkey, nested_tuple_bytes(400), soon)
            # the plain node has no validators: it stores the poison without looking at it
            assert attacker.raw_store(ident.peer_id, "geotrain_peers", sub, val, soon)
        finally:
            attacker.close()

        with Swarm(SwarmConfig(initial_peers=(maddr,), client_mode=True, **FAST)) as reader:  # type: ignore[arg-type]
            peers = wait_until(lambda: reader.get_peers(), 15)
            assert peers == {publisher.peer_id: honest}
            assert reader.started and publisher.started
        assert publisher.get_peers() == {publisher.peer_id: honest}
    assert plain.proc.poll() is None  # (the plain node itself never decoded the value)
