"""News over the data plane wakes a DHT poll loop early (geotrain.swarm.news)."""

from __future__ import annotations

import threading

from geotrain.swarm.news import PLAN_NEWS, Contact, NewsWaiter, send_news, serve_news
from geotrain.transport import Transport, TransportConfig


def test_waiter_returns_on_poll_on_news_and_on_stop() -> None:
    stop = threading.Event()
    w = NewsWaiter(stop, poll_s=30.0, min_gap_s=0.0)
    w.poke()
    assert w.wait() and w.had_news  # news ended the wait, not the 30 s poll
    quick = NewsWaiter(stop, poll_s=0.01, min_gap_s=0.0)
    assert quick.wait() and not quick.had_news  # the poll period alone ends a wait
    threading.Timer(0.05, lambda: (stop.set(), w.poke())).start()
    assert not w.wait()  # stop ends the loop


def test_a_due_timer_shortens_one_wait_and_only_that_one() -> None:
    stop = threading.Event()
    w = NewsWaiter(stop, poll_s=3600.0, min_gap_s=0.0)
    assert w.wait(at_most_s=0.0) and not w.had_news  # would sit out the hour-long poll otherwise
    assert w.wait(at_most_s=-5.0)  # a time already past: no wait, never a negative one
    w.poke()
    assert w.wait(at_most_s=7200.0) and w.had_news  # news still ends a wait at once


class _VirtualTime:
    """A clock that moves only when the waiter waits out its gap (on ``stop``)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _VirtualStop(threading.Event):
    def __init__(self, clock: _VirtualTime) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.now += timeout or 0.0
        return self.is_set()


def test_a_burst_of_news_is_merged_into_reads_at_most_every_min_gap() -> None:
    clock = _VirtualTime()
    w = NewsWaiter(_VirtualStop(clock), poll_s=30.0, min_gap_s=0.25, clock=clock)
    reads: list[float] = []
    while clock() < 1.0:
        for _ in range(100):  # a flood: 100 pieces of news before each read
            w.poke()
        assert w.wait() and w.had_news
        reads.append(clock())
    assert w.received == 100 * len(reads)
    assert all(b - a >= 0.25 for a, b in zip(reads, reads[1:], strict=False)), reads
    assert len(reads) == 5  # at 0, 0.25, ..., 1.0 virtual seconds: one read per gap, whatever the flood


def test_news_from_many_threads_is_all_counted() -> None:
    w = NewsWaiter(threading.Event(), poll_s=30.0)
    threads = [threading.Thread(target=lambda: [w.poke() for _ in range(2_000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert w.received == 8_000


def test_news_crosses_the_data_plane_and_a_dead_contact_only_costs_a_log_line() -> None:
    stop = threading.Event()
    waiter = NewsWaiter(stop, poll_s=30.0, min_gap_s=0.0)
    with Transport(TransportConfig(), peer_id="peer").start() as peer, \
            Transport(TransportConfig(), peer_id="coord").start() as coord:
        serve_news(peer, PLAN_NEWS, waiter)
        with Transport(TransportConfig(), peer_id="gone").start() as gone:
            dead = gone.address
        t = send_news(coord, [Contact("peer", peer.address), Contact("gone", dead)], PLAN_NEWS, timeout_s=1.0)
        assert waiter.wait() and waiter.had_news  # the news, not the 30 s poll
        t.join(10)
        assert not t.is_alive() and waiter.received == 1
