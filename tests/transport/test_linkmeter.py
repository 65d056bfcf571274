"""Passive link figures from stamped messages: right on a link that holds them, silent on one that keeps up."""

from __future__ import annotations

import math

from geotrain.transport.linkmeter import InboundMeter

MB = 1 << 20


def feed(meter: InboundMeter, sender: str, sends: list[float], sizes: list[int], bandwidth: float,
         latency: float = 0.05, offset: float = 0.0, free: float = 0.0) -> float:
    """Messages sent at ``sends`` over a FIFO link of ``bandwidth`` bytes/s: each arrives whole when its last
    byte is through (it starts when the one before it is through, or when it is sent). The receiver's clock
    reads ``offset`` ahead of the sender's. Returns when the link is free again."""
    for t, n in zip(sends, sizes, strict=True):
        start = max(t, free)
        free = start + n / bandwidth
        meter.arrived(sender, t, n, now=free + latency + offset)
    return free


def test_a_link_that_queues_messages_is_measured_exactly() -> None:
    meter = InboundMeter()
    # a burst of 8 messages of 1 MiB handed over 1 ms apart onto a 10 MB/s link: all but the first queue
    feed(meter, "a", [i * 0.001 for i in range(8)], [MB] * 8, bandwidth=10e6, offset=-1234.5)
    link = meter.links(now=1.0 - 1234.5)["a"]
    assert link.messages == 8 and link.queued == 7
    # the second one's start is taken at its hand-off plus the quickest trip, 1 ms late: within 0.2%
    assert link.bandwidth_bps is not None and math.isclose(link.bandwidth_bps, 10e6, rel_tol=2e-3)


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
    assert link.bandwidth_bps is not None and math.isclose(link.bandwidth_bps, 500e3, rel_tol=1e-2)


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


def test_a_link_that_carries_each_message_in_less_than_20_ms_gives_no_figure_however_long_its_queue() -> None:
    meter = InboundMeter()
    t = 0.0
    for i in range(40):  # 10 kB activations handed over back to back, arriving 3-10 ms apart (a 1-3 MB/s link)
        t += 0.0001
        meter.arrived("a", t, 10_000, now=t + 0.003 * (i + 1) + 0.007 * (i % 2))
    link = meter.links(now=1.0)["a"]
    assert link.queued > 20 and link.bandwidth_bps is None  # held, but for under 20 ms each on average


def compute_paced(meter: InboundMeter, *, fast_s: float, slow_s: float, bandwidth: float) -> float:
    """10 kB activations, one a second (compute-bound 1F1B: never two on the link at once), over a 6 MB/s
    link for ``fast_s`` and then over ``bandwidth``. Returns the end (sender's clock)."""
    free = feed(meter, "a", [i * 1.0 for i in range(int(fast_s))], [10_000] * int(fast_s), bandwidth=6e6,
                latency=0.001)
    sends = [fast_s + i * 1.0 for i in range(int(slow_s))]
    feed(meter, "a", sends, [10_000] * len(sends), bandwidth=bandwidth, latency=0.001, free=free)
    return fast_s + slow_s


def test_a_link_that_degrades_under_a_compute_bound_pipeline_is_measured_though_nothing_queues_behind_another() -> None:
    meter = InboundMeter()
    end = compute_paced(meter, fast_s=30, slow_s=30, bandwidth=20e3)  # 0.5 s a message, sent 1 s apart
    link = meter.links(now=end)["a"]
    assert link.queued == link.messages == 20  # the 20 s window holds only the degraded link's messages
    assert link.bandwidth_bps is not None and math.isclose(link.bandwidth_bps, 20e3, rel_tol=1e-2)
    # the figure comes once the held messages are half the window: 10 s after the degradation, not 20
    meter = InboundMeter()
    end = compute_paced(meter, fast_s=30, slow_s=11, bandwidth=20e3)
    assert meter.links(now=end)["a"].bandwidth_bps is not None


def test_messages_that_tcp_delivers_together_after_a_loss_are_counted_once_with_the_wait_before_them() -> None:
    meter = InboundMeter()
    for i in range(10):  # a fast baseline: 10 kB messages 2 ms in transit
        meter.arrived("a", i * 0.1, 10_000, now=i * 0.1 + 0.002)
    t = 1.0
    for _ in range(10):  # then, every 3 s, three messages sent together arrive together 2 s later
        for k in range(3):
            meter.arrived("a", t + 0.001 * k, 10_000, now=t + 2.0)
        t += 3.0
    link = meter.links(now=t)["a"]
    assert link.queued == link.messages == 21  # the clumps of the last 20 s
    # 30 kB per 2 s the link held them (the wait counts once per clump, not per message)
    assert link.bandwidth_bps is not None and math.isclose(link.bandwidth_bps, 15e3, rel_tol=1e-2)


def test_a_receiver_stalled_for_seconds_at_a_time_is_not_a_figure() -> None:
    meter = InboundMeter()
    t = 0.0
    for _ in range(400):  # 20 messages a second on a fast link; in each 5 s, the receiver is stalled for 2 s
        late = (t % 5.0) >= 3.0
        meter.arrived("a", t, 10_000, now=(t - t % 5.0 + 5.0) if late else t + 0.002)
        t += 0.05
    link = meter.links(now=t)["a"]
    assert 0 < link.queued < link.messages / 2 and link.bandwidth_bps is None


def test_a_receiver_clock_that_drifts_50_ppm_for_an_hour_is_not_a_slow_link() -> None:
    meter = InboundMeter()
    for i in range(36_000):  # 10 messages a second on a fast link; the receiver's clock runs 50 ppm fast
        t = i * 0.1
        meter.arrived("a", t, 10_000, now=(t + 0.002) * (1 + 50e-6))
    link = meter.links(now=3600.2)["a"]
    assert link.queued == 0 and link.bandwidth_bps is None


def test_a_sender_that_restarts_with_another_clock_starts_afresh() -> None:
    meter = InboundMeter()
    for i in range(10):  # a clock far ahead of the receiver's: transits of -1000 s
        meter.arrived("a", 1000.0 + i, 10_000, now=i + 0.002)
    for i in range(10):  # restarted (its stamps went back): its new transits are a normal 2 ms, not 1000 s late
        meter.arrived("a", 10.0 + i, 10_000, now=10.0 + i + 0.002)
    link = meter.links(now=20.0)["a"]
    assert link.messages == 10 and link.queued == 0
