"""Control-plane benchmark: what an idle or training swarm costs per peer, from N = 8 to N = 32 and beyond.

``python -m benchmarks.control_plane --peers 8,16,32`` starts, for each N, a
bootstrap ``geotrain dht`` and N real ``geotrain peer`` processes in
``--regions`` labelled regions inside a network namespace of its own, so the
kernel's counters of that namespace's loopback see this swarm's bytes and
nothing else. Every process gets a fixed port: DHT (libp2p) ports in one
range, data-plane ports in another, and an nftables table counts the bytes of
each range, so traffic is split into ``dht`` (hivemind: records, heartbeats,
reads) and ``data`` (link probes and news). Each byte is counted once (when
it is sent), with IP and TCP headers.

Phases, per N:

- ``join``: the N peers start, in waves of 16 (each wave joining through
  the bootstrap and two peers of the earlier waves), and settle (their
  first link probes, the first records) for ``--settle`` seconds and until
  the data plane is quiet; not reported per second.
- ``idle``: ``--window`` seconds of a joined swarm with no job.
- ``joiner``: one more peer joins; the bytes until it has published its
  link row are the probe cost a new peer causes (its probes and the ones
  others make of it).
- ``train`` (``--train``, N <= ``--train-max``): a tiny job planned over the
  swarm by ``geotrain run`` (one stage per pipeline, DiLoCo rounds every
  100 steps of 32 sequences: rounds of tens of seconds on this machine, as a
  WAN job's are; a control plane pays per round, not per step); the window
  is taken once the first plan is
  running; the coordinator's CPU seconds per minute are read from
  ``/proc`` for that window.

One JSON line per N and phase; a last ``summary`` line gives the growth of
bytes per peer per second from the smallest to the largest N and the targets:
<= 2 KB/s per peer idle and training, growth <= 1.3x from 8 to 32, a new
peer's probe bytes <= 40 MB at N = 32 and independent of N.

CI smoke: ``--peers 4 --window 10 --settle 10``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from geotrain.emulate.commands import NS_PREFIX
from geotrain.local.procs import Child, ChildGroup

DHT_BASE = 40000  # DHT ports: DHT_BASE + i (the bootstrap at DHT_BASE + 999)
DATA_BASE = 41000  # data-plane ports: DATA_BASE + i (the coordinator at DATA_BASE + 999)
REGIONS = ("us-east", "eu-west", "ap-south", "sa-east", "af-south", "me-central", "ca-central", "au-east")
WAVE = 16  # peers started at once; the next wave starts once these are ready


def _emit(rec: dict[str, Any]) -> None:
    print(json.dumps(rec), flush=True)


class Namespace:
    """One network namespace with its loopback up and, if ``nft`` exists, byte counters per port range."""

    def __init__(self, name: str, per_port: int = 0) -> None:
        self.name = name
        self.per_port = per_port
        self.nft = shutil.which("nft") is not None

    def __enter__(self) -> Namespace:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        self.run(["ip", "link", "set", "lo", "up"])
        # the fixed ports below are this namespace's alone: without this, an outgoing connection made before
        # a later peer binds its port can take that port as its ephemeral source, and the peer cannot start
        self.run(["sysctl", "-q", "-w", f"net.ipv4.ip_local_reserved_ports={DHT_BASE}-{DATA_BASE + 999}"])
        if self.nft:
            rules = [
                "add table inet gtcp",
                "add chain inet gtcp out { type filter hook output priority 0 ; }",
                # a packet is counted by the first rule that matches (accept ends this chain); libp2p dials
                # from its listening port, so "sport P" is what the node listening on P sends
                f"add rule inet gtcp out tcp sport {DHT_BASE + 998} counter accept",
                f"add rule inet gtcp out tcp sport {DHT_BASE + 999} counter accept",
                *[f"add rule inet gtcp out tcp sport {DHT_BASE + i} counter accept" for i in range(self.per_port)],
                f"add rule inet gtcp out tcp sport {DHT_BASE}-{DHT_BASE + 999} counter accept",
                f"add rule inet gtcp out tcp dport {DHT_BASE}-{DHT_BASE + 999} counter accept",
                f"add rule inet gtcp out tcp sport {DATA_BASE}-{DATA_BASE + 999} counter accept",
                f"add rule inet gtcp out tcp dport {DATA_BASE}-{DATA_BASE + 999} counter accept",
            ]
            for r in rules:
                self.run(["nft", *r.split()])
        return self

    def __exit__(self, *exc: object) -> None:
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout
        for pid in (int(p) for p in out.split() if p.isdigit()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def run(self, argv: list[str]) -> str:
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], check=True, capture_output=True,
                              text=True).stdout

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def counters(self) -> dict[str, int]:
        """Bytes sent on this namespace's loopback: ``total``, and ``dht``/``data`` where nft counts them."""
        total = int(self.run(["cat", "/sys/class/net/lo/statistics/tx_bytes"]))
        out: dict[str, int] = {"total": total}
        if self.nft:
            listing = json.loads(self.run(["nft", "-j", "list", "table", "inet", "gtcp"]))
            counts = [
                e["rule"]["expr"][1]["counter"]["bytes"]
                for e in listing["nftables"] if "rule" in e
            ]
            k = self.per_port
            out["coordinator_dht"], out["bootstrap_dht"] = counts[0], counts[1]
            for i in range(k):
                out[f"peer{i}_dht"] = counts[2 + i]
            out["dht"] = sum(counts[: 4 + k])
            out["data"] = counts[4 + k] + counts[5 + k]
        return out

    def dht_sockets(self) -> int | None:
        """Established TCP sockets of the DHT nodes (libp2p): one per node and open connection (None: no ``ss``)."""
        if shutil.which("ss") is None:
            return None
        out = self.run(["ss", "-Htn", "state", "established"])
        # "Recv-Q Send-Q LOCAL:PORT PEER:PORT": the first address of a line is the socket's own
        addrs = [[f for f in line.split() if ":" in f] for line in out.splitlines()]
        ports = [a[0].rsplit(":", 1)[1] for a in addrs if len(a) >= 2]
        return sum(1 for p in ports if p.isdigit() and DHT_BASE <= int(p) <= DHT_BASE + 999)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _delta(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in b}


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` and their children (hivemind's DHT, p2pd)."""
    tick = os.sysconf("SC_CLK_TCK")
    seen: set[int] = set()
    todo = list(pids)
    total = 0.0
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        todo += [int(k) for k in kids]
    return total


def _peer_cmd(i: int, maddrs: list[str], region: str, args: argparse.Namespace, state: Path) -> list[str]:
    return ["peer", "--initial-peers", *maddrs, "--region", region, "--threads", "1",
            "--dht-port", str(DHT_BASE + i), "--port", str(DATA_BASE + i),
            "--state-dir", str(state / f"peer{i}"), *(["--heartbeat", str(args.heartbeat)] if args.heartbeat else []),
            *_idle_flag(args)]


def _idle_flag(args: argparse.Namespace) -> list[str]:
    return [] if args.idle_connection is None else ["--idle-connection", str(args.idle_connection)]


TRAIN_JOB = """
[job]
name = "control-plane"
seed = 1
[model]
preset = "tiny"
[data]
max_bytes = 262144
[pipeline]
stages = 1
micro_batch_size = 8
microbatches = 4
[sync]
every = 100
[stop]
steps = 100000
[swarm]
min_peers = {n}
wait_peers_s = 600
"""


def run_n(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """All phases for one swarm size; returns the figures the summary compares."""
    ns_name = f"{NS_PREFIX}cp{os.getpid() % 100000}-lo"
    figures: dict[str, Any] = {"peers": n}
    with Namespace(ns_name, per_port=args.per_port) as ns, ChildGroup(preload=True) as group, tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        boot = group.start("dht", ["dht", "--host", "127.0.0.1", "--port", str(DHT_BASE + 999), *_idle_flag(args)], prefix=ns.prefix)
        maddrs = boot.wait_event("ready", timeout=120)["maddrs"]
        peers: list[Child] = []
        ready: list[list[str]] = []  # each started peer's DHT addresses
        # in waves, each joining through the bootstrap and two peers of the waves before (as a user lists
        # several initial peers): 64 peers joining one bootstrap at once on 2 cores outlast its ping timeout
        for first in range(0, n, WAVE):
            initial = [*maddrs, *(m for r in ready[:: max(1, len(ready) // 2)][:2] for m in r)]
            wave = [group.start(f"peer{i}", _peer_cmd(i, initial, REGIONS[i % args.regions], args, state),
                                prefix=ns.prefix, stderr_path=str(state / f"peer{i}.err"))
                    for i in range(first, min(n, first + WAVE))]
            ready += [p.wait_event("ready", timeout=60 + 10 * len(wave))["maddrs"] for p in wave]
            peers += wave
        figures["settle_s"] = _settle_quiet(ns, args.settle, max_s=args.settle + 10 * n, window_s=args.quiet_window)
        c0, t0 = ns.counters(), time.monotonic()
        _settle(args.window)
        d, dt = _delta(c0, ns.counters()), time.monotonic() - t0
        figures["idle_bps_per_peer"] = d["total"] / dt / n
        figures["idle_dht_bps_per_peer"] = d.get("dht", d["total"]) / dt / n
        # libp2p keeps every connection a node opened (its connection manager prunes past 256): the idle cost
        # that grows with N beyond what the DHT's operations explain may be per connection (keep-alives)
        sockets = ns.dht_sockets()
        figures["dht_connections_per_node"] = None if sockets is None else sockets / (n + 1)
        _emit({"bench": "control_plane", "phase": "idle", "peers": n, "window_s": round(dt, 1),
               "settle_s": round(figures["settle_s"], 1),
               "dht_connections_per_node": _round(figures["dht_connections_per_node"]),
               **{f"{k}_bytes_per_peer_s": round(v / dt / n, 1) for k, v in d.items()}})

        # one more peer: the probe bytes its arrival causes (its probes and the others' probes of it)
        c0, t0 = ns.counters(), time.monotonic()
        joiner = group.start("joiner", _peer_cmd(n, maddrs, REGIONS[n % args.regions], args, state), prefix=ns.prefix)
        joiner.wait_event("ready", timeout=120)
        links = joiner.wait_event("links", timeout=120)
        _settle(args.joiner_tail)
        d, dt = _delta(c0, ns.counters()), time.monotonic() - t0
        figures["joiner_bytes"] = d.get("data", d["total"])
        _emit({"bench": "control_plane", "phase": "joiner", "peers": n, "window_s": round(dt, 1),
               "links_measured": links.get("count"), "data_bytes": d.get("data"), "dht_bytes": d.get("dht"),
               "total_bytes": d["total"]})

        if args.train and n <= args.train_max:
            job = state / "job.toml"
            job.write_text(TRAIN_JOB.format(n=n + 1))
            coord = group.start("run", ["run", str(job), "--initial-peers", *maddrs, "--port", str(DATA_BASE + 999),
                                        "--dht-port", str(DHT_BASE + 998),
                                        "--report-dir", str(state / "report"), "--json",
                                        "--full-read-every", str(args.full_read_every)], prefix=ns.prefix)
            _wait_training(coord, timeout=300 + 20 * n)
            _settle(args.settle)
            reads0: dict[str, int] = {}
            tok0 = _tokens(coord, reads0)
            c0, t0, cpu0 = ns.counters(), time.monotonic(), _cpu_s([coord.pid])
            _settle(args.window)
            d, dt = _delta(c0, ns.counters()), time.monotonic() - t0
            cpu = _cpu_s([coord.pid]) - cpu0
            reads = dict(reads0)
            tokens = _tokens(coord, reads) - tok0
            figures["train_dht_bps_per_peer"] = d.get("dht", d["total"]) / dt / (n + 1)
            _emit({"bench": "control_plane", "phase": "train", "peers": n + 1, "window_s": round(dt, 1),
                   "coordinator_cpu_s_per_min": round(cpu / dt * 60, 2), "tokens_in_window": tokens,
                   "full_read_every_s": args.full_read_every,
                   # the watch's ticks in the window: covered by the region digests, and full reads
                   "watch_ticks_covered": reads.get("covered", 0) - reads0.get("covered", 0),
                   "watch_full_reads": reads.get("full", 0) - reads0.get("full", 0),
                   **{f"{k}_bytes_per_peer_s": round(v / dt / (n + 1), 1) for k, v in d.items()}})
        group.close(grace=2.0)  # nothing is measured past here: not the ~8 s a bootstrap's DHT takes to stop
    return figures


def _wait_training(coord: Child, timeout: float) -> None:
    """Until the coordinator has published a plan and reports trained tokens."""
    deadline = time.monotonic() + timeout
    planned = False
    while time.monotonic() < deadline:
        ev = coord.next_event(timeout=max(0.1, deadline - time.monotonic()))
        if ev is None:
            break
        planned = planned or ev.get("event") == "plan"
        if planned and ev.get("event") == "progress" and ev.get("tokens", 0) > 0:
            return
        if ev.get("event") in ("done", "error"):
            raise RuntimeError(f"the job ended before training: {ev}")
    raise RuntimeError("the job did not start training in time")


def _tokens(coord: Child, reads: dict[str, int] | None = None) -> int:
    """The coordinator's newest count of trained tokens (its progress events so far); ``reads`` gets its
    newest count of the watch's reads (digest ticks, ticks they covered, full reads)."""
    tokens = 0
    while (ev := coord.next_event(timeout=0.01)) is not None:
        if ev.get("event") == "progress":
            tokens = int(ev.get("tokens", 0))
            if reads is not None and isinstance(ev.get("watch_reads"), dict):
                reads.update(ev["watch_reads"])
    return tokens


def _settle_quiet(ns: Namespace, seconds: float, *, max_s: float, window_s: float = 5.0) -> float:
    """Wait ``seconds``, then until the data plane is quiet (the join's link probes are over) or ``max_s``.

    Quiet is two ``window_s`` windows in a row without a bulk probe's bytes (a probe starts at 256 KiB):
    one quiet 5 s window was seen between two peers' late probes at N = 32 on 2 cores, and the idle
    window then counted 3.5 KB/s per peer of join probes.
    """
    t0 = time.monotonic()
    _settle(seconds)
    quiet = 0
    while ns.nft and time.monotonic() - t0 < max_s and quiet < 2:
        c0 = ns.counters()
        _settle(window_s)
        quiet = quiet + 1 if ns.counters()["data"] - c0["data"] < 64 << 10 else 0
    return time.monotonic() - t0


def _settle(seconds: float) -> None:
    """The benchmark's measurement windows are wall time by definition."""
    time.sleep(seconds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.control_plane", description=__doc__.split("\n")[0])
    ap.add_argument("--peers", default="8,16,32", help="swarm sizes, comma-separated")
    ap.add_argument("--regions", type=int, default=4, help="region labels the peers are spread over")
    ap.add_argument("--window", type=float, default=60.0, help="seconds measured per phase")
    ap.add_argument("--settle", type=float, default=30.0, help="seconds after joining before measuring")
    ap.add_argument("--quiet-window", type=float, default=5.0, metavar="S",
                    help="settling ends after two S-second windows in a row without probe bytes")
    ap.add_argument("--joiner-tail", type=float, default=5.0, help="seconds counted after the joiner's link row")
    ap.add_argument("--heartbeat", type=float, default=0.0, help="peer heartbeat period (0: the peer's default)")
    ap.add_argument("--idle-connection", type=float, default=None, metavar="S",
                    help="every node closes DHT connections unused for S seconds (0: never; default: the peers' own)")
    ap.add_argument("--train", action="store_true", help="also measure while training a tiny job")
    ap.add_argument("--per-port", type=int, default=0, metavar="K", help="also count the DHT bytes of peers 0..K-1")
    ap.add_argument("--train-max", type=int, default=8, help="largest N trained (CPU: every peer computes)")
    ap.add_argument("--full-read-every", type=float, default=60.0, metavar="S",
                    help="the coordinator's --full-read-every (0: every progress record every tick, no digests)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or shutil.which("ip") is None:
        _emit({"bench": "control_plane", "skipped": "needs root and iproute2 (a network namespace per run)"})
        return 0
    sizes = [int(x) for x in args.peers.split(",")]
    args.regions = max(1, min(args.regions, len(REGIONS)))
    results = [run_n(n, args) for n in sizes]
    lo, hi = results[0], results[-1]
    summary: dict[str, Any] = {
        "bench": "control_plane", "summary": True, "peers": sizes,
        "idle_bytes_per_peer_s": [round(r["idle_bps_per_peer"], 1) for r in results],
        "idle_growth": round(hi["idle_bps_per_peer"] / lo["idle_bps_per_peer"], 3),
        # the DHT's share alone (the steady state: an idle peer re-probes hourly, so data-plane bytes in an idle
        # window are a join's probes that outlasted the settling)
        "idle_dht_bytes_per_peer_s": [round(r["idle_dht_bps_per_peer"], 1) for r in results],
        "idle_dht_growth": round(hi["idle_dht_bps_per_peer"] / lo["idle_dht_bps_per_peer"], 3),
        "dht_connections_per_node": [_round(r["dht_connections_per_node"]) for r in results],
        "joiner_bytes": [r["joiner_bytes"] for r in results],
        "joiner_growth": round(hi["joiner_bytes"] / max(1, lo["joiner_bytes"]), 3),
        "targets": {"bytes_per_peer_s": 2048, "growth": 1.3, "joiner_bytes_at_32": 40_000_000},
    }
    trained = [r for r in results if "train_dht_bps_per_peer" in r]
    if trained:
        summary["train_dht_bytes_per_peer_s"] = [round(r["train_dht_bps_per_peer"], 1) for r in trained]
    _emit(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
