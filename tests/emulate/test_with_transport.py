"""The delay hook inside geotrain's real transport (pyzmq), over loopback and over shaped namespaces.

These check the contract between LinkEmulator and ``geotrain.transport``:
a message is not delivered before its emulated arrival time, and messages to
one destination overlap in flight instead of paying the delay one by one.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

import pytest
import torch

from geotrain.emulate import Emulation, EmulationConfig, LinkEmulator, LinkEmulatorConfig, topology_from_dict
from tests.emulate.support import requires_netns

transport = pytest.importorskip("geotrain.transport.endpoint")
from geotrain.transport.config import TransportConfig  # noqa: E402
from geotrain.transport.message import Message  # noqa: E402

pytestmark = pytest.mark.timeout(60)

TOPO = topology_from_dict({
    "regions": {"a": {}, "b": {}},
    # 20 Mbit/s, 100 ms RTT -> 50 ms one way
    "links": [{"a": "a", "b": "b", "bandwidth_gbps": 0.02, "rtt_ms": 100}],
})  # fmt: skip
RATE = 0.02e9 / 8  # bytes/s
ONE_WAY = 0.05


def pair(stack: ExitStack, em: Emulation | None, shape_bandwidth: bool) -> tuple[Any, Any]:
    """Transport in region a -> transport in region b, each with its region's LinkEmulator."""
    ts: dict[str, Any] = {}
    for region in ("a", "b"):
        emu = LinkEmulator(LinkEmulatorConfig.from_topology(TOPO, region, shape_bandwidth=shape_bandwidth))
        host = em.address(region) if em else "127.0.0.1"
        cfg = TransportConfig(host=host, send_timeout_s=20, recv_timeout_s=20)
        with em.inside(region) if em else ExitStack():  # in a namespace, its I/O threads are born there
            t = transport.Transport(cfg, peer_id=f"peer-{region}", region=region, emulator=emu).start()
        stack.callback(t.close)
        ts[region] = t
    ts["a"].connect("peer-b", ts["b"].address, region="b")
    return ts["a"], ts["b"]


def timed(a: Any, b: Any, nbytes: int, count: int = 1) -> list[float]:
    """Send ``count`` messages of ``nbytes`` a -> b back to back; seconds from the first send to each arrival."""
    t0 = time.monotonic()
    for i in range(count):
        a.send_async("peer-b", Message(kind="blob", tag=(i,), tensors={"x": torch.zeros(nbytes, dtype=torch.uint8)}))
    out = []
    for i in range(count):
        b.recv("blob", (i,), timeout=20)
        out.append(time.monotonic() - t0)
    return out


def test_in_process_fallback_adds_delay_and_bandwidth_on_loopback() -> None:
    with ExitStack() as stack:
        a, b = pair(stack, None, shape_bandwidth=True)
        timed(a, b, 1)  # warm the connection so its setup is not counted
        (small,) = timed(a, b, 100)
        assert small >= ONE_WAY
        assert small < ONE_WAY + 0.25, small  # loose upper bound: a loaded 2-core box
        # 4 x 250 kB back to back: FIFO at 2.5 MB/s, so the last arrives after 4 x 0.1 s + 50 ms, not 4 x 150 ms
        arrivals = timed(a, b, 250_000, count=4)
        assert arrivals[-1] >= 4 * 250_000 / RATE + ONE_WAY
        assert arrivals[-1] < 4 * 250_000 / RATE + ONE_WAY + 0.3, arrivals


@pytest.mark.netns
@requires_netns
def test_across_namespaces_kernel_shapes_bandwidth_and_the_hook_adds_delay() -> None:
    em = Emulation(EmulationConfig(topology=TOPO, tag="ttransport"))
    with em, ExitStack() as stack:
        a, b = pair(stack, em, shape_bandwidth=False)  # the kernel shapes; counting it twice would halve it
        timed(a, b, 1)
        (small,) = timed(a, b, 100)
        assert ONE_WAY <= small < ONE_WAY + 0.25, small
        (big,) = timed(a, b, 2_500_000)  # 1 s at 20 Mbit/s (goodput ~96% of that) + 50 ms
        expected = 2_500_000 / (RATE * 0.956) + ONE_WAY
        assert big == pytest.approx(expected, rel=0.15), (big, expected)


def test_a_pipeline_hop_keeps_several_messages_in_flight_on_a_delayed_link() -> None:
    # the stage's sender thread must not pay the link's delay per message: 6 activations sent back to back
    # overlap in flight, as over a real link. Checked by order, not by wall time: a sender that waits for each
    # send (which the emulated link accepts one delay after it was handed over) hands message i+1 to the
    # transport only after message i was accepted; an overlapping one hands some over before.
    from geotrain.pipeline.hop import HopSender

    with ExitStack() as stack:
        a, b = pair(stack, None, shape_bandwidth=False)
        timed(a, b, 1)  # warm the connection
        handed: list[float] = []
        accepted: dict[int, float] = {}
        send_async = a.send_async

        def recording(peer: str, msg: Message, **kw: Any) -> Any:
            i = len(handed)
            handed.append(time.monotonic())
            fut = send_async(peer, msg, **kw)
            fut.add_done_callback(lambda _f: accepted.setdefault(i, time.monotonic()))
            return fut

        a.send_async = recording
        hop = HopSender(a, "peer-b", codec="none", timeout_s=20, queue_size=8)
        stack.callback(hop.close)
        t0 = time.monotonic()
        for i in range(6):
            hop.submit(Message(kind="pp.act", tag=(i,), step=0, tensors={"x": torch.zeros(64)}))
        for i in range(6):
            b.recv("pp.act", (i,), timeout=20)
        took = time.monotonic() - t0
        hop.flush(0)
        assert took >= ONE_WAY, took  # none arrived before the link's delay
        assert hop.take_counters().messages == 6 and len(handed) == 6 and len(accepted) == 6
        overlapped = [i for i in range(5) if handed[i + 1] < accepted[i]]
        assert overlapped, (handed, accepted)  # a sender waiting on each send overlaps none


def test_a_hop_sends_fp16_overflow_as_bf16_and_its_thread_survives_a_bad_message() -> None:
    from geotrain.pipeline.hop import HopSender

    with ExitStack() as stack:
        a, b = pair(stack, None, shape_bandwidth=False)
        hop = HopSender(a, "peer-b", codec="fp16", timeout_s=20, queue_size=4)
        stack.callback(hop.close)
        big = torch.full((8,), 1e6)  # beyond fp16's +-65504
        hop.submit(Message(kind="pp.act", tag=(0,), step=0, tensors={"x": big}))
        got = b.recv("pp.act", (0,), timeout=20).tensors["x"]
        assert torch.allclose(got, big, rtol=1e-2)  # bf16: fp32's range, 8 bits of mantissa
        hop.submit(Message(kind="pp.act", tag=(1,), step=1, tensors={"x": torch.ones(4)}))
        assert b.recv("pp.act", (1,), timeout=20).tensors["x"].sum() == 4
        hop.flush(1)
