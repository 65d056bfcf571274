"""Passive link figures from stamped messages: exact on a link that queues them, silent on one that keeps up."""

from __future__ import annotations

import math

from geotrain.transport.linkmeter import InboundMeter

MB = 1 << 20


def feed(meter: InboundMeter, sender: str, sends: list[float], sizes: list[int], bandwidth: float,
         latency: float = 0.05) -> None:
    """Messages sent at ``sends`` over a FIFO link of ``bandwidth`` bytes/s: each arrives whole when its last
    byte is through (it starts when the one before it is through, or when it is sent)."""
    free = 0.0
    for t, n in zip(sends, sizes, strict=True):
        start = max(t, free)
        free = start + n / bandwidth
        meter.arrived(sender, t, n, now=free + latency)


def test_a_link_that_queues_messages_is_measured_exactly() -> None:
    meter = InboundMeter()
    # a burst of 8 messages of 1 MiB handed over 1 ms apart onto a 10 MB/s link: all but the first queue
    feed(meter, "a", [i * 0.001 for i in range(8)], [MB] * 8, bandwidth=10e6)
    link = meter.links(now=1.0)["a"]
    assert link.messages == 8 and link.queued == 7
    assert link.bandwidth_bps is not None and math.isclose(link.bandwidth_bps, 10e6, rel_tol=1e-9)


def test_a_link_that_keeps_up_gives_no_figure() -> None:
    meter = InboundMeter()
    # one 100 kB message every 50 ms on a 100 MB/s link: each is through long before the next
    feed(meter, "a", [i * 0.05 for i in range(40)], [100_000] * 40, bandwidth=100e6)
    link = meter.links(now=3.0)["a"]
    assert link.messages == 40 and link.queued == 0 and link.bandwidth_bps is None


def test_a_few_late_arrivals_from_a_busy_receiver_are_not_a_figure() -> None:
    meter = InboundMeter()
    t = 0.0
    for i in range(40):  # compute-paced sends; every tenth arrival is 80 ms late (the receiver's thread was busy)
        meter.arrived("a", t, 100_000, now=t + 0.01 + (0.08 if i % 10 == 9 else 0.0))
        t += 0.05
    link = meter.links(now=t)["a"]
    assert link.queued == 4 and link.bandwidth_bps is None  # 4 of 40 queued: below the share that makes a figure


def test_one_pipeline_step_pattern_on_a_slow_link() -> None:
    """1F1B on a slow hop: each step's first activation follows the last step's end, the rest queue."""
    meter = InboundMeter()
    sends = []
    for step in range(4):
        base = step * 2.0
        sends += [base, base + 0.01, base + 0.02, base + 0.03]  # 4 microbatches a step
    feed(meter, "a", sends, [200_000] * len(sends), bandwidth=500e3)  # 0.4 s a message: the hop limits
    link = meter.links(now=10.0)["a"]
    assert link.queued == 12 and link.messages == 16
    assert link.bandwidth_bps is not None and math.isclose(link.bandwidth_bps, 500e3, rel_tol=1e-9)


def test_old_messages_leave_the_window_and_bad_stamps_are_ignored() -> None:
    meter = InboundMeter(window_s=10.0)
    feed(meter, "a", [i * 0.001 for i in range(8)], [MB] * 8, bandwidth=10e6)
    for bad in (float("nan"), float("inf"), "soon", None, True):
        meter.arrived("a", bad, MB, now=2.0)
    assert meter.links(now=2.0)["a"].messages == 8
    assert meter.links(now=30.0) == {}


def test_stamps_that_go_backwards_are_no_sample_and_forged_senders_stay_bounded() -> None:
    meter = InboundMeter(max_senders=16)
    meter.arrived("a", 100.0, MB, now=1.0)
    meter.arrived("a", 5.0, MB, now=3.0)  # a restarted sender's clock: no sample from this pair
    assert meter.links(now=3.0)["a"].queued == 0
    for i in range(100):
        meter.arrived(f"forged-{i}", 0.0, 1, now=3.0)
    assert len(meter.links(now=3.0)) == 16


def test_gaps_shorter_than_a_loaded_machines_scheduling_delays_are_no_sample() -> None:
    meter = InboundMeter()
    t = 0.0
    for i in range(40):  # 10 kB activations handed over back to back, arriving 3-10 ms apart (scheduling)
        t += 0.0001
        meter.arrived("a", t, 10_000, now=t + 0.003 * (i + 1) + 0.007 * (i % 2))
    link = meter.links(now=1.0)["a"]
    assert link.queued == 0 and link.bandwidth_bps is None
