"""`geotrain peer` x3 in 2 regions: `geotrain status --json` sees them and their measured links; a SIGKILLed peer leaves."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from geotrain.local.procs import ChildGroup
from geotrain.local.swarm import start_local_swarm

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]


def status(maddrs: list[str], took: list[float] | None = None) -> dict[str, Any]:
    """``geotrain status --json``, a fresh process; ``took`` gets how long the call took."""
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "geotrain", "status", "--initial-peers", *maddrs, "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    if took is not None:
        took.append(time.monotonic() - t0)
    return json.loads(out.stdout)


def wait_for(
    predicate: Any, maddrs: list[str], timeout: float, took: list[float] | None = None
) -> tuple[dict[str, Any], float]:
    t0 = time.monotonic()
    while True:
        s = status(maddrs, took)
        if predicate(s):
            return s, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"status never matched within {timeout}s; last: {s}")


def test_status_lists_peers_and_links_and_a_killed_peer_disappears(children: ChildGroup) -> None:
    heartbeat = 1.0
    swarm = start_local_swarm(children, regions=["eu", "eu", "us"], heartbeat_s=heartbeat)
    ids = set(swarm.peer_ids())

    def complete(s: dict[str, Any]) -> bool:
        links = {(x["src"], x["dst"]) for x in s["links"] if x["bandwidth_bps"] > 0 and x["rtt_s"] > 0}
        # each pair is measured by its younger peer (geotrain.swarm.probe_targets): one direction of it
        return {p["peer_id"] for p in s["peers"]} == ids and all(
            (a, b) in links or (b, a) in links for a in ids for b in ids if a != b
        )

    s, _ = wait_for(complete, swarm.maddrs, timeout=90)
    assert {p["region"] for p in s["peers"]} == {"eu", "us"}
    for link in s["links"]:
        # measured figures, not defaults; how fast loopback is on a loaded machine is no test's business
        # (one CI run measured 0.7 MB/s for a bulk probe beside the rest of the suite)
        assert {link["src"], link["dst"]} <= ids
        assert math.isfinite(link["bandwidth_bps"]) and link["bandwidth_bps"] > 0
        assert math.isfinite(link["rtt_s"]) and link["rtt_s"] > 0

    victim = swarm.ready[2]["peer_id"]
    children.kill(swarm.peers[2], signal.SIGKILL)
    killed_at = time.monotonic()
    took: list[float] = []
    wait_for(lambda st: victim not in {p["peer_id"] for p in st["peers"]}, swarm.maddrs, timeout=90, took=took)
    gone_after = time.monotonic() - killed_at
    # a record lives 3 heartbeats and an RPC timeout (3 s) after its last refresh. The first status call that
    # reads the DHT after that no longer lists it: at most two calls after the expiry (the one under way, then
    # the next), each a fresh `geotrain status` process whose time is measured, not assumed: beside the suite
    # and two busy loops the calls after the kill took over 25 s in all, past the fixed allowance this had
    assert gone_after < 3 * heartbeat + 3 + 2 * max(took) + 2.0, (gone_after, took)
