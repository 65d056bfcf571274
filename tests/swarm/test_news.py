"""News over the data plane wakes a DHT poll loop early (geotrain.swarm.news)."""

from __future__ import annotations

import threading
import time

from geotrain.swarm.news import PLAN_NEWS, Contact, NewsWaiter, send_news, serve_news
from geotrain.transport import Transport, TransportConfig


def test_waiter_returns_on_poll_on_news_and_on_stop() -> None:
    stop = threading.Event()
    w = NewsWaiter(stop, poll_s=30.0, min_gap_s=0.0)
    w.poke()
    t0 = time.monotonic()
    assert w.wait() and time.monotonic() - t0 < 5  # news: no 30 s poll
    quick = NewsWaiter(stop, poll_s=0.01, min_gap_s=0.0)
    assert quick.wait()  # the poll period alone ends a wait
    threading.Timer(0.05, lambda: (stop.set(), w.poke())).start()
    assert not w.wait()  # stop ends the loop


def test_a_due_timer_shortens_one_wait_and_only_that_one() -> None:
    stop = threading.Event()
    w = NewsWaiter(stop, poll_s=3600.0, min_gap_s=0.0)
    assert w.wait(at_most_s=0.0) and not w.had_news  # would sit out the hour-long poll otherwise
    assert w.wait(at_most_s=-5.0)  # a time already past: no wait, never a negative one
    w.poke()
    assert w.wait(at_most_s=7200.0) and w.had_news  # news still ends a wait at once


def test_a_burst_of_news_is_merged_into_reads_at_most_every_min_gap() -> None:
    stop = threading.Event()
    w = NewsWaiter(stop, poll_s=30.0, min_gap_s=0.2)
    reads = 0
    flood = threading.Event()

    def hostile() -> None:
        while not flood.is_set():
            w.poke()
            time.sleep(0.001)

    th = threading.Thread(target=hostile)
    th.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.0:
        assert w.wait()
        reads += 1
    flood.set()
    th.join(5)
    assert w.received > 50 and reads <= 1.0 / 0.2 + 2


def test_news_crosses_the_data_plane_and_a_dead_contact_only_costs_a_log_line() -> None:
    stop = threading.Event()
    waiter = NewsWaiter(stop, poll_s=30.0, min_gap_s=0.0)
    with Transport(TransportConfig(), peer_id="peer").start() as peer, \
            Transport(TransportConfig(), peer_id="coord").start() as coord:
        serve_news(peer, PLAN_NEWS, waiter)
        with Transport(TransportConfig(), peer_id="gone").start() as gone:
            dead = gone.address
        t = send_news(coord, [Contact("peer", peer.address), Contact("gone", dead)], PLAN_NEWS, timeout_s=1.0)
        t0 = time.monotonic()
        assert waiter.wait() and time.monotonic() - t0 < 10
        t.join(10)
        assert not t.is_alive() and waiter.received == 1
