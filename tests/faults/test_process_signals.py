"""Items 7 and 12: startup against dead initial peers; SIGINT/SIGTERM to a peer and to the coordinator.

Item 7 at the command line: ``geotrain peer`` whose first initial peer is dead
and second alive starts (the peer of the signal test); with every initial peer dead it exits fast (well
under the DHT's own start timeout) with a message that names the problem.

Item 12: the signal goes to the main process only (as ``kill PID`` or a
supervisor would send it), so the process itself must take its DHT process
and ``p2pd`` down. Within 10 s nothing of its session is left, and every TCP
port it listened on can be bound again.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geotrain.local.procs import Child, ChildGroup
from tests.swarm.helpers import dead_maddr, listening_tcp_ports, session_pids, wait_until

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]


def _peer_args(maddrs: list[str]) -> list[str]:
    return ["peer", "--initial-peers", *maddrs, "--region", "us", "--threads", "1", "--heartbeat", "1",
            "--probe-every", "600"]


def test_all_initial_peers_dead_fails_fast_and_clearly() -> None:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "geotrain", *_peer_args([dead_maddr(), dead_maddr()])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # p2pd, should any be left
        except ProcessLookupError:
            pass
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert "none of the initial peers answered" in err, err[-2000:]
    assert "Traceback" not in err
    # the bound is hivemind's bootstrap (dial attempts, then its timeout), ~30 s here, ~50 s under heavy load
    assert time.monotonic() - t0 < 75


def _stop_and_check(child: Child, sig: int) -> None:
    pids = session_pids(child.pid)
    ports = listening_tcp_ports(pids)
    assert len(pids) >= 3 and ports, (pids, ports)  # main process, its DHT process, p2pd; some listeners
    t0 = time.monotonic()
    os.kill(child.pid, sig)  # the main process only
    child.proc.wait(timeout=10)
    wait_until(lambda: not session_pids(child.pid), max(0.5, 10 - (time.monotonic() - t0)), interval=0.1)
    assert time.monotonic() - t0 < 10
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))  # raises if anything still holds it


@pytest.mark.parametrize(
    "peer_sig,coord_sig",
    [
        (signal.SIGTERM, signal.SIGINT),
        (signal.SIGINT, signal.SIGTERM),
    ],
    ids=["peer-TERM-coordinator-INT", "peer-INT-coordinator-TERM"],
)
def test_peer_and_coordinator_stop_on_a_signal_with_every_child(
    children: ChildGroup, tmp_path: Path, peer_sig: int, coord_sig: int
) -> None:
    boot = children.start("dht", ["dht", "--host", "127.0.0.1"])
    maddrs = boot.wait_event("ready", 60)["maddrs"]
    # item 7, the good half: the first initial peer is dead, the second alive
    peer = children.start("peer", _peer_args([dead_maddr(), *maddrs]))
    peer.wait_event("ready", 180)  # dialling the dead peer first costs time on a loaded box
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "sig"\n[model]\npreset = "tiny"\n[swarm]\nmin_peers = 3\nwait_peers_s = 120\n')
    coord = children.start("run", ["run", str(job), "--initial-peers", *maddrs, "--json",
                                   "--report-dir", str(tmp_path / "report")])
    coord.wait_event("start", 90)  # the job is published; the coordinator now waits for peers
    _stop_and_check(peer, peer_sig)
    _stop_and_check(coord, coord_sig)
