"""A large message to a peer in another region goes over several TCP connections and is reassembled.

The split and the reassembly are pure (any part order, empty buffers, every bad part refused with a typed
error and nothing kept); two real transports in different regions then carry striped messages, requests and
small messages side by side, with and without CURVE.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
import torch
import zmq

from geotrain.errors import ConfigError, FrameTooLargeError, PeerTimeoutError, ProtocolError
from geotrain.transport import CurveConfig, Limits, Message, Transport, TransportConfig
from geotrain.transport.stripes import Reassembly, StripeError, part_range, split_message
from geotrain.transport.wire import pack_header, unpack_header


def header_for(sizes: list[int]) -> bytes:
    return pack_header({"kind": "x", "sender": "a", "tensors": [{"name": "t", "codec": "raw", "meta": {},
                                                                  "frames": sizes}]})


def parts_of(buffers: list[bytes], k: int, stripe_id: int = 7) -> tuple[bytes, list[list[object]]]:
    header = header_for([len(b) for b in buffers])
    parts = split_message([header, *buffers], k, stripe_id, lambda meta: meta)
    return header, parts


def feed(r: Reassembly, part: list[object], sender: str = "a", now: float = 0.0) -> object:
    meta, *frames = part
    return r.add(sender, meta, frames, now)  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [2, 3, 5, 16])
@pytest.mark.parametrize("sizes", [[10], [0, 7, 0, 1000, 3], [1, 1], [4096, 4096, 1]])
def test_the_parts_cover_the_payload_and_reassemble_in_any_order(k: int, sizes: list[int]) -> None:
    buffers = [bytes((i * 31 + j) % 251 for j in range(n)) for i, n in enumerate(sizes)]
    header, parts = parts_of(buffers, k)
    total = sum(sizes)
    assert len(parts) == k and parts[0][1] == header  # part 0 carries the message's own header
    for p, part in enumerate(parts):
        assert part[0]["part"] == p and part[0]["parts"] == k and part[0]["total"] == total  # type: ignore[index]
        start, end = part_range(p, k, total)
        assert sum(memoryview(f).nbytes for f in part[1 + (p == 0):]) == end - start  # type: ignore[arg-type]
    r = Reassembly(Limits(), timeout_s=10.0)
    done = None
    for part in [*parts[1:], parts[0]][::-1]:
        assert done is None
        done = feed(r, part)
    assert done is not None and done.header == header  # type: ignore[attr-defined]
    assert [bytes(b) for b in done.buffers] == buffers  # type: ignore[attr-defined]
    assert r.pending == 0 and r.pending_bytes == 0


def test_a_part_that_does_not_fit_is_refused_and_its_stripe_dropped() -> None:
    _, parts = parts_of([bytes(1000)], 4)
    r = Reassembly(Limits(), timeout_s=10.0)
    feed(r, parts[0])
    with pytest.raises(StripeError, match="came twice"):
        feed(r, parts[0])
    assert r.pending == 0  # dropped whole: a later part starts a new stripe, which then never completes
    feed(r, parts[1])
    bad = [{**parts[2][0], "total": 999}, *parts[2][1:]]  # type: ignore[dict-item]
    with pytest.raises(StripeError, match="says 4 parts of 999"):
        feed(r, bad)
    short = [parts[1][0], memoryview(bytes(10))]
    with pytest.raises(StripeError, match="carries 10 bytes"):
        feed(r, short, sender="b")
    for meta in ({"id": 1, "part": 0, "parts": 17, "total": 10}, {"id": 1, "part": 2, "parts": 2, "total": 10},
                 {"id": -1, "part": 0, "parts": 2, "total": 10}, {"id": 1, "part": 0, "parts": 2, "total": 0},
                 {"id": 1, "part": True, "parts": 2, "total": 10}, {"id": "1", "part": 0, "parts": 2, "total": 5}):
        with pytest.raises(StripeError):
            r.add("c", meta, [b"h", bytes(5)], 0.0)
    with pytest.raises(StripeError, match="no message header"):
        r.add("c", {"id": 1, "part": 0, "parts": 2, "total": 10}, [], 0.0)
    assert r.pending == 0


def test_pending_stripes_are_bounded_in_bytes_per_sender_and_in_time() -> None:
    r = Reassembly(Limits(max_buffered_bytes=1500, max_frame_bytes=2000, max_message_bytes=2000), timeout_s=5.0)
    with pytest.raises(StripeError):  # over the message limit: refused before anything is kept
        r.add("a", {"id": 1, "part": 1, "parts": 2, "total": 2001}, [bytes(1001)], 0.0)
    _, one = parts_of([bytes(2000)], 2, stripe_id=1)
    _, two = parts_of([bytes(2000)], 2, stripe_id=2)
    feed(r, one[1], now=0.0)
    assert r.pending_bytes == 1000  # what arrived, not the 2000 its stripe claims
    with pytest.raises(FrameTooLargeError, match="pending stripes"):
        feed(r, two[1], now=1.0)
    assert r.pending_bytes == 1000
    assert r.expire(4.0) == [] and r.expire(5.5) == [("a", 1)] and r.pending_bytes == 0
    # a small part claiming the largest message is refused: a part must carry its whole range
    big = Reassembly(Limits(), timeout_s=5.0)
    with pytest.raises(StripeError, match="carries 10 bytes"):
        big.add("a", {"id": 1, "part": 1, "parts": 2, "total": Limits().max_message_bytes}, [bytes(10)], 0.0)
    assert big.pending_bytes == 0 and big.pending == 0
    r = Reassembly(Limits(), timeout_s=5.0)
    for i in range(64):
        r.add("a", {"id": i, "part": 1, "parts": 2, "total": 2}, [b"x"], 0.0)
    with pytest.raises(StripeError, match="64 stripes pending"):
        r.add("a", {"id": 64, "part": 1, "parts": 2, "total": 2}, [b"x"], 0.0)
    r.add("b", {"id": 64, "part": 1, "parts": 2, "total": 2}, [b"x"], 0.0)  # another sender is not held back


def test_a_header_whose_frames_do_not_add_up_to_the_stripe_is_refused() -> None:
    header = header_for([10, 10])
    parts = split_message([header, bytes(10), bytes(5)], 2, 1, lambda meta: meta)  # 15 bytes, header says 20
    r = Reassembly(Limits(), timeout_s=5.0)
    feed(r, parts[0])
    with pytest.raises(ProtocolError, match="declares 20"):
        feed(r, parts[1])
    assert r.pending == 0 and unpack_header(header, Limits()).kind == "x"


def test_streams_are_validated() -> None:
    for bad in (0, 17):
        with pytest.raises(ConfigError, match="streams"):
            TransportConfig(streams=bad)
    with pytest.raises(ConfigError, match="stripe_min_bytes"):
        TransportConfig(stripe_min_bytes=0)


def curve(allowed: frozenset[bytes] = frozenset()) -> CurveConfig:
    public, secret = zmq.curve_keypair()
    return CurveConfig(public_key=public, secret_key=secret, allowed_clients=allowed)


def _connections(port: str) -> int:
    out = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"], capture_output=True,
                         text=True, check=True).stdout
    return len([line for line in out.splitlines() if line.strip()])


@pytest.fixture(params=["plain", "curve"])
def regions(request: pytest.FixtureRequest) -> Iterator[tuple[Transport, Transport, Transport]]:
    """``a`` in eu with 4 streams; ``b`` in us (another region) and ``c`` in eu (the same region)."""
    keys = {n: curve() for n in "abc"} if request.param == "curve" else {}
    members = frozenset(k.public_key for k in keys.values())

    def cfg(name: str, streams: int) -> TransportConfig:
        c = keys.get(name)
        own = None if c is None else CurveConfig(public_key=c.public_key, secret_key=c.secret_key,
                                                 allowed_clients=members)
        return TransportConfig(streams=streams, stripe_min_bytes=64 * 1024, send_timeout_s=20, recv_timeout_s=20,
                               curve=own)

    a = Transport(cfg("a", 4), peer_id="a", region="eu").start()
    b = Transport(cfg("b", 4), peer_id="b", region="us").start()
    c = Transport(cfg("c", 4), peer_id="c", region="eu").start()

    def key(name: str) -> bytes | None:
        return keys[name].public_key if keys else None

    a.connect("b", b.address, region="us", curve_server_key=key("b"))
    a.connect("c", c.address, region="eu", curve_server_key=key("c"))
    b.connect("a", a.address, region="eu", curve_server_key=key("a"))
    c.connect("a", a.address, region="eu", curve_server_key=key("a"))
    try:
        yield a, b, c
    finally:
        for t in (a, b, c):
            t.close()


def test_a_large_message_to_another_region_goes_over_several_connections(
    regions: tuple[Transport, Transport, Transport],
) -> None:
    a, b, c = regions
    big = torch.randn(300_000)  # 1.2 MB: striped over 4 connections
    ids = torch.arange(1000)
    small = torch.ones(10)
    a.send("b", Message("grad", (1,), meta={"m": 1}, tensors={"g": big, "ids": ids}), timeout=20)
    a.send("b", Message("grad", (2,), tensors={"g": small}), timeout=20)  # whole, on the first connection
    got = b.recv("grad", (1,), timeout=20)
    assert torch.equal(got.tensors["g"], big) and torch.equal(got.tensors["ids"], ids) and got.meta["m"] == 1
    assert got.sender == "a" and torch.equal(b.recv("grad", (2,), timeout=20).tensors["g"], small)
    assert _connections(b.address.rsplit(":", 1)[1]) == 4  # a's four outboxes to b, each its own TCP stream
    a.send("c", Message("grad", (3,), tensors={"g": big}), timeout=20)  # same region: one connection
    assert torch.equal(c.recv("grad", (3,), timeout=20).tensors["g"], big)
    assert _connections(c.address.rsplit(":", 1)[1]) == 1
    # a striped request is answered over the connection its first part came in on
    b.serve("echo", lambda m: Message("echo.reply", tensors={"n": torch.tensor([m.tensors["g"].numel()])}))
    reply = a.request("b", Message("echo", tensors={"g": big}), timeout=20)
    assert int(reply.tensors["n"][0]) == big.numel()
    assert sum(b.stats.dropped.values()) == 0
    assert (a.stats.striped_sent, b.stats.striped_recv, c.stats.striped_recv) == (2, 2, 0)
    assert b.stats.recv_bytes["a"] >= 2 * big.numel() * 4


@pytest.mark.parametrize("regions", ["plain"], indirect=True)  # a raw socket has no CURVE key to send with
def test_a_forged_part_is_dropped_and_the_receiver_keeps_serving(
    regions: tuple[Transport, Transport, Transport],
) -> None:
    """A part sent by hand on a raw socket, claiming more streams than there can be, is counted and dropped;
    the next real message arrives."""
    a, b, _ = regions
    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(b.address)
    try:
        stripe = pack_header({"kind": "__stripe__", "sender": "mallory",
                              "meta": {"id": 1, "part": 0, "parts": 99, "total": 10}})
        raw.send_multipart([stripe, header_for([10]), bytes(10)])
        b.wait_stats(lambda s: s.dropped.get("StripeError", 0) >= 1, timeout=10)
    finally:
        raw.close()
    a.send("b", Message("grad", (5,), tensors={"g": torch.randn(300_000)}), timeout=20)
    assert b.recv("grad", (5,), timeout=20).sender == "a"


def test_connections_refused_until_the_sender_is_admitted_are_all_dialled_again() -> None:
    """Under CURVE a peer may dial before the other has it on its allow-list: every one of its connections is
    refused, then dialled again once it is admitted, and a striped message then crosses all of them. (What was
    handed to a refused connection is lost with it, as with one connection: the protocols above resend.)"""
    ka, kb = curve(), curve()
    b = Transport(TransportConfig(curve=kb, recv_timeout_s=20, stripe_min_bytes=64 * 1024), peer_id="b",
                  region="us").start()
    a = Transport(TransportConfig(curve=CurveConfig(public_key=ka.public_key, secret_key=ka.secret_key),
                                  send_timeout_s=30, stripe_min_bytes=64 * 1024), peer_id="a", region="eu").start()
    try:
        a.connect("b", b.address, region="us", curve_server_key=kb.public_key)
        b.wait_stats(lambda s: s.dropped.get("AuthenticationError", 0) >= 1, timeout=20)  # refused at the handshake
        b.allow_clients({ka.public_key})
        for i in range(60):  # until a redial got through: a ping sent before it is lost with its connection
            a.send("b", Message("ping", (i,)))
            try:
                b.recv("ping", (i,), timeout=0.5)
                break
            except PeerTimeoutError:
                continue
        big = torch.randn(100_000)
        a.send("b", Message("grad", (1,), tensors={"g": big}))
        got = b.recv("grad", (1,), timeout=30)
        assert torch.equal(got.tensors["g"], big) and b.stats.striped_recv == 1
    finally:
        a.close()
        b.close()


def test_only_the_payload_counts_towards_striping() -> None:
    """With a 1-byte threshold a message with no tensors (its header alone past the threshold) goes whole, and a
    one-byte tensor is split into mostly empty parts that still reassemble."""
    b = Transport(TransportConfig(stripe_min_bytes=1), peer_id="b", region="us").start()
    a = Transport(TransportConfig(stripe_min_bytes=1), peer_id="a", region="eu").start()
    try:
        a.connect("b", b.address, region="us")
        a.send("b", Message("note", (1,), meta={"text": "hello"}))
        assert b.recv("note", (1,), timeout=20).meta["text"] == "hello"
        a.send("b", Message("note", (2,), tensors={"x": torch.tensor([7], dtype=torch.uint8)}))
        assert b.recv("note", (2,), timeout=20).tensors["x"].tolist() == [7]
        assert (a.stats.striped_sent, b.stats.striped_recv, sum(b.stats.dropped.values())) == (1, 1, 0)
    finally:
        a.close()
        b.close()


def test_parts_resume_where_a_full_connection_stopped_them() -> None:
    """With one message queued per connection, sending many striped messages at once fills the queues: each
    message resumes at the part that did not fit, and every one arrives whole, while the sender's I/O thread
    keeps serving (no message is lost or reordered within itself)."""
    b = Transport(TransportConfig(stripe_min_bytes=1024, recv_timeout_s=30), peer_id="b", region="us").start()
    a = Transport(TransportConfig(stripe_min_bytes=1024, sndhwm=1, send_timeout_s=30), peer_id="a",
                  region="eu").start()
    try:
        a.connect("b", b.address, region="us")
        sent = [torch.full((50_000,), float(i)) for i in range(30)]
        futures = [a.send_async("b", Message("bulk", (i,), tensors={"x": x})) for i, x in enumerate(sent)]
        for i, x in enumerate(sent):
            assert torch.equal(b.recv("bulk", (i,), timeout=30).tensors["x"], x)
        assert all(f.result(timeout=10) > 0 for f in futures)
        assert b.stats.striped_recv == 30 and sum(b.stats.dropped.values()) == 0
    finally:
        a.close()
        b.close()
