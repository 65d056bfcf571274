from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator

import pytest
import torch

from geotrain.errors import PeerTimeoutError, TransportError
from geotrain.peers.probe import ProbeConfig, measure_link, serve_probes
from geotrain.transport import Limits, Message, Transport, TransportConfig


@pytest.fixture
def pair() -> Iterator[tuple[Transport, Transport]]:
    a = Transport(TransportConfig(), peer_id="a").start()
    b = Transport(TransportConfig(), peer_id="b").start()
    a.connect("b", b.address)
    b.connect("a", a.address)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_binds_port_zero_and_reports_real_address(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    assert a.address.startswith("tcp://127.0.0.1:")
    assert not a.address.endswith(":0") and a.address != b.address


def test_tensors_round_trip_with_codecs_and_raw_ints(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    x = torch.randn(3, 7)
    ids = torch.randint(0, 256, (2, 9))
    sent = a.send("b", Message(kind="act", tag=(0, 4, 1), job="j", step=4, tensors={"x": x, "ids": ids}), codec="fp16")
    msg = b.recv("act", (0, 4, 1), timeout=10)
    assert msg.sender == "a" and msg.step == 4 and msg.job == "j"
    assert msg.tensors["x"].dtype == torch.float32 and msg.tensors["x"].shape == (3, 7)
    assert torch.allclose(msg.tensors["x"], x, atol=1e-2, rtol=1e-3)
    assert torch.equal(msg.tensors["ids"], ids)
    assert sent >= x.numel() * 2 + ids.numel() * 8


def test_tags_match_out_of_order(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    for mb in range(3):
        a.send("b", Message(kind="act", tag=(mb,), tensors={"x": torch.full((2,), float(mb))}))
    for mb in (2, 0, 1):
        assert b.recv("act", (mb,), timeout=10).tensors["x"][0].item() == mb


def test_recv_times_out_with_typed_error(pair: tuple[Transport, Transport]) -> None:
    _, b = pair
    with pytest.raises(PeerTimeoutError):  # one that ignored its timeout would hang until the test times out
        b.recv("act", (99,), timeout=0.3)


def test_wait_stats_wakes_on_the_count_it_waits_for(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    with pytest.raises(TimeoutError, match="within 0.2s"):  # nothing arrived
        b.wait_stats(lambda s: s.recv_messages > 0, timeout=0.2)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(b.wait_stats, lambda s: s.recv_messages >= 2, 10)
        a.send("b", Message(kind="act", tag=(0,)), timeout=10)
        a.send("b", Message(kind="act", tag=(1,)), timeout=10)
        got = waiting.result(timeout=30)
    assert got.recv_messages == 2 and got.recv_bytes["a"] > 0
    assert a.wait_stats(lambda s: s.sent_messages == 2, timeout=10).sent_bytes["b"] > 0  # already true: at once


def test_request_reply_and_probe(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    b.serve("echo", lambda m: Message(kind="echo.ok", meta={"n": m.meta["n"] + 1}, tensors=m.tensors))
    reply = a.request("b", Message(kind="echo", meta={"n": 41}, tensors={"x": torch.ones(5)}), timeout=10)
    assert reply.meta["n"] == 42 and torch.equal(reply.tensors["x"], torch.ones(5))
    serve_probes(b)
    link = measure_link(a, "b", ProbeConfig(pings=3, start_bytes=1 << 16, max_bytes=1 << 20, rounds=2))
    assert link.bandwidth_bps > 1e6 and 0 < link.rtt_s < 1.0


def test_stale_and_foreign_messages_are_dropped(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    b.set_context(job="old", plan_version=1)
    b.set_context(job="job1", plan_version=3)
    a.send("b", Message(kind="act", job="old", plan_version=5))  # a job b has left
    a.send("b", Message(kind="act", job="job1", plan_version=2))  # an older plan of b's job
    a.send("b", Message(kind="act", job="job1", plan_version=3, step=7))
    assert b.recv("act", timeout=10).step == 7
    assert b.stats.dropped["StaleMessageError"] == 2
    # a job b has not joined yet is kept: a neighbour may switch a moment earlier
    a.send("b", Message(kind="act", job="next", plan_version=1, step=9))
    assert b.recv("act", timeout=10).step == 9


def test_a_message_stamped_with_a_newer_plan_of_our_job_is_reported(pair: tuple[Transport, Transport]) -> None:
    # how a peer whose replan news was lost learns of the plan from its first neighbour that read it
    a, b = pair
    seen: list[int] = []
    b.on_newer_plan(lambda: seen.append(1))
    b.set_context(job="j", plan_version=2)
    for job, version, step in (("j", 2, 1), ("other", 9, 2), ("", 9, 3), ("j", 3, 4)):
        a.send("b", Message(kind="act", job=job, plan_version=version, step=step))
        assert b.recv("act", timeout=10).step == step  # every one is delivered
    assert seen == [1]  # only job j's plan 3 is newer than b's


def test_recv_unblocks_on_close() -> None:
    t = Transport(TransportConfig(), peer_id="c").start()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            t.recv("never", timeout=30)
        except TransportError as e:
            errors.append(e)

    th = threading.Thread(target=wait)
    th.start()
    t.close()
    th.join(10)
    assert not th.is_alive() and errors


def test_send_to_unknown_peer_is_a_clear_error() -> None:
    with Transport(TransportConfig(), peer_id="d") as t, pytest.raises(TransportError, match="connect"):
        t.send("nobody", Message(kind="x"), timeout=2)


def test_a_send_handed_over_just_before_close_still_arrives() -> None:
    # send() returns once ZMQ holds the frames; closing right after must linger, not drop them
    with Transport(TransportConfig(), peer_id="b").start() as b:
        for i in range(5):
            a = Transport(TransportConfig(), peer_id="a").start()
            a.connect("b", b.address)
            a.send("b", Message(kind="last", tag=(i,), tensors={"x": torch.ones(4 << 20)}))
            a.close()
            assert b.recv("last", (i,), timeout=10).tensors["x"].shape == (4 << 20,)


def test_mailbox_overflow_evicts_the_oldest_unclaimed_message() -> None:
    # room for two 4 KiB messages: a third evicts the oldest one nobody has taken yet
    cfg = TransportConfig(limits=Limits(max_buffered_bytes=9 * 1024))
    a = Transport(TransportConfig(), peer_id="a").start()
    b = Transport(cfg, peer_id="b").start()
    a.connect("b", b.address)
    try:
        def put(kind: str, value: int) -> None:  # every "hop" shares one tag, as a stream of replies would
            a.send("b", Message(kind=kind, tag=(0,), tensors={"x": torch.full((1024,), float(value))}))

        put("hop", 1)
        assert b.recv("hop", (0,), timeout=10).tensors["x"][0] == 1  # taken: it no longer counts
        put("late", 2)  # nobody takes this one: the oldest unclaimed from here on
        put("hop", 3)
        put("hop", 4)  # three unclaimed now: "late" must go, not the newer hop 3
        assert b.wait_stats(lambda s: s.dropped["MailboxOverflow"] >= 1, timeout=10).dropped["MailboxOverflow"] == 1
        assert b.recv("hop", (0,), timeout=10).tensors["x"][0] == 3
        assert b.recv("hop", (0,), timeout=10).tensors["x"][0] == 4
        with pytest.raises(PeerTimeoutError):
            b.recv("late", (0,), timeout=0.2)
    finally:
        a.close()
        b.close()


def test_messages_of_a_replaced_plan_leave_no_trace_that_breaks_the_mailbox(pair: tuple[Transport, Transport]) -> None:
    # a new plan version drops the old plan's unclaimed messages; the mailbox's bookkeeping must survive that
    # through its periodic compaction (hundreds of later messages), or the I/O thread dies and recv hangs
    a, b = pair
    b.set_context(job="j", plan_version=1)
    for i in range(5):
        a.send("b", Message(kind="old", tag=(i,), job="j", plan_version=1, tensors={"x": torch.zeros(4)}))
    b.recv("old", (4,), timeout=10)  # all five are in
    b.set_context(job="j", plan_version=2)
    for i in range(400):
        a.send("b", Message(kind="new", tag=(0,), job="j", plan_version=2, step=i))
        assert b.recv("new", (0,), timeout=10).step == i


def test_a_failed_io_thread_closes_the_transport_instead_of_hanging(pair: tuple[Transport, Transport]) -> None:
    a, b = pair

    def broken(item: object) -> None:
        raise RuntimeError("a bug in filing")

    b._file = broken  # type: ignore[method-assign]
    a.send("b", Message(kind="x", tag=(0,)))
    # "closed", not a PeerTimeoutError: the waiting recv was woken by the failure, not by its 30 s timeout
    with pytest.raises(TransportError, match="closed") as err:
        b.recv("x", (0,), timeout=30)
    assert not isinstance(err.value, PeerTimeoutError)
