"""Does a WAN link carry a bulk transfer faster over several TCP connections than over one?

PCCL and Atlas open several connections per link because one TCP stream may not
fill a long fat pipe: its window (or its recovery after a loss at a shallow
queue) caps it below the link's rate. Before the data plane opens more than one
connection per peer pair, this measures whether it would help on the emulated
links: two region namespaces, a link shaped by ``htb`` at ``--mbit`` with the
delay layer holding every packet for half of ``--rtt-ms`` each way (the same
emulation every contender of ``benchmarks.e2e`` runs on).

Each trial sends ``--mbytes`` from region ``a`` to region ``b``, split evenly over
K already-connected TCP streams (the handshakes are not timed: the data plane
keeps its connections open), and times it from the first byte sent to the last
byte received. Trials of every K are interleaved, ``--repeats`` times, so
drift on a shared machine hits every K alike; each K's median is compared with
one stream's (a ratio). ``--data-plane`` also times one message of the same
size through geotrain's own data plane (a Transport per region with
``TransportConfig.streams`` = K, for each K up to 16: the message is split over
K connections). Prints JSON lines: ``config``, one ``trial`` per transfer, one
``streams`` per K, with ``--data-plane`` one ``data_plane_trial`` per message
and a ``data_plane`` median per K, and a ``summary``.

Needs root, network namespaces and /dev/net/tun. CI smoke: ``--smoke``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

CHUNK = 1 << 16


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _sysctl(ns: str, name: str) -> str | None:
    try:
        out = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n", name], capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def trial(em: Any, streams: int, nbytes: int, timeout_s: float, cc: str | None = None) -> float:
    """Seconds to move ``nbytes`` from region a to region b over ``streams`` connected TCP streams (their
    congestion control ``cc``, else the kernel's default)."""
    srv = em.socket("b")
    srv.bind((em.address("b"), 0))
    srv.listen(streams)
    srv.settimeout(timeout_s)
    port = srv.getsockname()[1]
    senders = []
    for _ in range(streams):
        s = em.socket("a")
        if cc is not None:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        s.settimeout(timeout_s)
        s.connect((em.address("b"), port))
        senders.append(s)
    receivers = []
    for _ in range(streams):
        c, _ = srv.accept()
        c.settimeout(timeout_s)
        receivers.append(c)
    srv.close()
    shares = [nbytes // streams + (1 if i < nbytes % streams else 0) for i in range(streams)]
    done_at: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    go = threading.Event()
    payload = memoryview(os.urandom(CHUNK))

    def send(sock: socket.socket, n: int) -> None:
        try:
            go.wait(timeout_s)
            while n > 0:
                k = min(n, CHUNK)
                sock.sendall(payload[:k])
                n -= k
            sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            with lock:
                errors.append(e)

    def receive(sock: socket.socket, n: int) -> None:
        buf = bytearray(CHUNK)
        got = 0
        try:
            while got < n:
                k = sock.recv_into(buf)
                if k == 0:
                    break
                got += k
            if got != n:
                raise OSError(f"received {got} of {n} bytes")
            with lock:
                done_at.append(time.perf_counter())
        except OSError as e:
            with lock:
                errors.append(e)

    threads = [threading.Thread(target=receive, args=(c, n), daemon=True) for c, n in zip(receivers, shares, strict=True)]
    threads += [threading.Thread(target=send, args=(s, n), daemon=True) for s, n in zip(senders, shares, strict=True)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    go.set()
    for t in threads:
        t.join(timeout_s)
    for s in (*senders, *receivers):
        s.close()
    if errors or len(done_at) != streams:
        raise RuntimeError(f"transfer over {streams} streams failed: {errors[:1] or 'timed out'}")
    return max(done_at) - start


def data_plane_trial(em: Any, nbytes: int, timeout_s: float, streams: int = 1) -> float:
    """Seconds for geotrain's data plane (one :class:`~geotrain.transport.Transport` per region, ``streams``
    connections per peer pair: ``TransportConfig.streams``) to deliver one message of ``nbytes`` tensor bytes
    from region a to region b."""
    import torch

    from geotrain.transport import Message, Transport, TransportConfig

    ts = {}
    try:
        for region in ("a", "b"):
            cfg = TransportConfig(host=em.address(region), send_timeout_s=timeout_s, recv_timeout_s=timeout_s,
                                  streams=streams)
            with em.inside(region):  # its I/O threads are born in the namespace
                ts[region] = Transport(cfg, peer_id=f"bench-{region}", region=region).start()
        ts["a"].connect("bench-b", ts["b"].address, region="b")
        ts["a"].send("bench-b", Message(kind="warm"), timeout=timeout_s)  # the handshake is not timed
        ts["b"].recv("warm", timeout=timeout_s)
        x = torch.randint(-128, 127, (nbytes,), dtype=torch.int8)
        start = time.perf_counter()
        ts["a"].send_async("bench-b", Message(kind="bulk", tensors={"x": x}))
        ts["b"].recv("bulk", timeout=timeout_s)
        return time.perf_counter() - start
    finally:
        for t in ts.values():
            t.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.streams", description=__doc__.split("\n\n")[0])
    p.add_argument("--mbit", type=float, default=100.0, help="link rate, Mbit/s (default 100)")
    p.add_argument("--rtt-ms", type=float, default=80.0, help="link round-trip time, ms (default 80)")
    p.add_argument("--streams", default="1,2,4,8", help="stream counts to compare (1 is always included)")
    p.add_argument("--mbytes", type=float, default=32.0, help="bytes per transfer, MB (default 32)")
    p.add_argument("--repeats", type=int, default=3, help="trials of each stream count (default 3)")
    p.add_argument("--data-plane", action="store_true",
                   help="also time geotrain's data plane (one Transport message) over the same link")
    p.add_argument("--cc", default=None,
                   help="the senders' TCP congestion control (e.g. cubic, bbr; default: the kernel's)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes for CI: 20 Mbit/s, 40 ms, 1 MB, 1 and 2 streams")
    args = p.parse_args(argv)
    if args.smoke:
        args.mbit, args.rtt_ms, args.mbytes, args.streams, args.repeats = 20.0, 40.0, 1.0, "1,2", 1
        args.data_plane = True
    counts = sorted({1, *(int(x) for x in str(args.streams).split(",") if x.strip())})
    if counts[0] < 1 or counts[-1] > 64 or args.mbit <= 0 or args.rtt_ms < 0 or args.mbytes <= 0 or args.repeats < 1:
        p.error("streams in 1..64, --mbit > 0, --rtt-ms >= 0, --mbytes > 0, --repeats >= 1")

    from geotrain.emulate import Emulation, EmulationConfig, topology_from_dict
    from geotrain.emulate.delay import DelayConfig, DelayLayer

    topo = topology_from_dict({"regions": {"a": {}, "b": {}},
                               "links": [{"a": "a", "b": "b", "bandwidth_gbps": args.mbit / 1e3,
                                          "rtt_ms": args.rtt_ms}]})
    cfg = EmulationConfig(topology=topo, tag=f"st{os.getpid() % 100000}")
    nbytes = int(args.mbytes * 1e6)
    ideal_s = nbytes * 8 / (args.mbit * 1e6)
    timeout_s = max(60.0, 20 * ideal_s + 10 * args.rtt_ms / 1e3)
    results: dict[int, list[float]] = {k: [] for k in counts}
    with Emulation(cfg) as em, DelayLayer(DelayConfig.from_emulation(cfg)):
        ns = em.namespace("a")
        emit(event="config", mbit=args.mbit, rtt_ms=args.rtt_ms, mbytes=args.mbytes, streams=counts,
             repeats=args.repeats, bdp_bytes=round(args.mbit * 1e6 / 8 * args.rtt_ms / 1e3),
             congestion_control=args.cc or _sysctl(ns, "net.ipv4.tcp_congestion_control"),
             tcp_wmem=_sysctl(ns, "net.ipv4.tcp_wmem"), tcp_rmem=_sysctl(em.namespace("b"), "net.ipv4.tcp_rmem"),
             ideal_s=round(ideal_s, 3))
        for r in range(args.repeats):
            for k in counts if r % 2 == 0 else reversed(counts):
                s = trial(em, k, nbytes, timeout_s, args.cc)
                results[k].append(s)
                emit(event="trial", repeat=r, streams=k, seconds=round(s, 4), mbit_s=round(nbytes * 8 / s / 1e6, 2))
        plane: dict[int, list[float]] = {k: [] for k in counts if k <= 16} if args.data_plane else {}
        for r in range(args.repeats if plane else 0):
            for k in sorted(plane) if r % 2 == 0 else sorted(plane, reverse=True):
                sec = data_plane_trial(em, nbytes, timeout_s, k)
                plane[k].append(sec)
                emit(event="data_plane_trial", repeat=r, streams=k, seconds=round(sec, 4),
                     mbit_s=round(nbytes * 8 / sec / 1e6, 2))
    base = statistics.median(results[1])
    for k, secs in sorted(plane.items()):
        med = statistics.median(secs)
        emit(event="data_plane", streams=k, median_s=round(med, 4), mbit_s=round(nbytes * 8 / med / 1e6, 2),
             link_share=round(ideal_s / med, 3), vs_one_stream=round(base / med, 3),
             vs_data_plane_1=round(statistics.median(plane[1]) / med, 3))
    for k in counts:
        med = statistics.median(results[k])
        emit(event="streams", streams=k, median_s=round(med, 4), mbit_s=round(nbytes * 8 / med / 1e6, 2),
             link_share=round(ideal_s / med, 3), speedup_vs_1=round(base / med, 3))
    best = min(counts, key=lambda k: statistics.median(results[k]))
    emit(event="summary", best_streams=best, speedup_vs_1=round(base / statistics.median(results[best]), 3),
         one_stream_link_share=round(ideal_s / base, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
