"""A sender thread per hop, so encoding and hand-off to ZMQ overlap the stage's compute.

What is a *hop*? The directed link from one stage to a neighbour in the same
pipeline (forward: activations; backward: activation gradients). Each hop has
its own :class:`HopSender`: the stage thread enqueues a message and goes on
computing; the sender thread encodes it with the hop's codec (inside
``Transport.send_async``) and hands the frames to the transport without
waiting for them to leave, so several messages are in flight on the link at
once (at most ``queue_size``), as on a real network: an emulated link's delay
overlaps between messages instead of being paid one message after another. A
failure is kept and re-raised in the stage thread at its next
:meth:`HopSender.check`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import queue
import threading
import time
from dataclasses import dataclass

from geotrain.errors import CodecError, PeerTimeoutError, StageFailedError, TransportError
from geotrain.transport import Message, Transport
from geotrain.transport.linkmeter import STAMP

__all__ = ["HopSender", "HopCounters"]

logger = logging.getLogger(__name__)


@dataclass
class HopCounters:
    """Totals of one hop since the last :meth:`HopSender.take_counters`."""

    messages: int = 0
    bytes: int = 0
    busy_s: float = 0.0  # encode + hand-off time in the sender thread


class HopSender:
    """Sends messages to ``peer`` in enqueue order from a daemon thread."""

    def __init__(self, transport: Transport, peer: str, *, codec: str, timeout_s: float, queue_size: int) -> None:
        self.transport, self.peer, self.codec, self.timeout_s = transport, peer, codec, timeout_s
        self._queue: queue.Queue[tuple[Message, str] | None] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._counters = HopCounters()
        self._error: BaseException | None = None
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._in_flight = threading.BoundedSemaphore(queue_size)  # handed to the transport, not yet sent
        self._widened = False  # an fp16 message overflowed and went as bf16 (logged once)
        self._thread = threading.Thread(target=self._run, name=f"gt-hop-{peer[:12]}", daemon=True)
        self._thread.start()

    def submit(self, msg: Message, codec: str | None = None) -> None:
        """Queue ``msg`` (sent with ``codec``, default the hop's); waits only if the queue is full."""
        self.check(msg.step)
        with self._lock:
            self._pending += 1
        try:
            self._queue.put((msg, codec or self.codec), timeout=self.timeout_s)
        except queue.Full:
            with self._lock:
                self._pending -= 1
            raise StageFailedError(
                f"hop to {self.peer} stuck: {self._queue.maxsize} messages not sent within {self.timeout_s}s",
                peer=self.peer,
                step=msg.step,
            ) from None

    def flush(self, step: int) -> None:
        """Wait until every queued message was handed to the transport; raise the hop's failure if any."""
        deadline = time.monotonic() + self.timeout_s
        with self._idle:
            while self._pending and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._idle.wait(left)
        self.check(step)
        if self._pending:
            raise StageFailedError(f"hop to {self.peer}: sends not done within {self.timeout_s}s", peer=self.peer, step=step)

    def check(self, step: int) -> None:
        if self._error is not None:
            err = self._error
            raise StageFailedError(f"sending to {self.peer} failed at step {step}: {err}", peer=self.peer, step=step) from err

    def take_counters(self) -> HopCounters:
        with self._lock:
            c, self._counters = self._counters, HopCounters()
        return c

    def close(self) -> None:
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass  # the thread is a daemon; it ends with the process

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            msg, codec = item
            if self._error is not None:  # after a failure, drain without sending
                self._settle()
                continue
            if not self._in_flight.acquire(timeout=self.timeout_s):
                self._fail(PeerTimeoutError(f"{self._queue.maxsize} messages to {self.peer} not sent within "
                                            f"{self.timeout_s}s", peer=self.peer, step=msg.step), msg.step)
                self._settle()
                continue
            t0 = time.perf_counter()
            # the receiver's passive link figure reads the gaps between these stamps (geotrain.transport.linkmeter)
            msg = dataclasses.replace(msg, meta={**msg.meta, STAMP: time.monotonic()})
            try:
                try:
                    fut = self.transport.send_async(self.peer, msg, codec=codec, timeout=self.timeout_s)
                except CodecError as e:
                    if codec != "fp16":
                        raise
                    # values beyond fp16's range (+-65504): this message goes as bf16 (same size, fp32's range)
                    # rather than failing the step; the receiver reads each tensor's codec from its descriptor
                    if not self._widened:
                        self._widened = True
                        logger.warning("hop to %s: %s; sending such messages as bf16", self.peer, e)
                    fut = self.transport.send_async(self.peer, msg, codec="bf16", timeout=self.timeout_s)
            except Exception as e:  # our transport closed, a codec refused the values, a bug: fail the step, not the thread
                self._in_flight.release()
                self._fail(e, msg.step)
                self._settle()
                continue
            fut.add_done_callback(functools.partial(self._sent, step=msg.step, busy_s=time.perf_counter() - t0))

    def _sent(self, fut: concurrent.futures.Future[int], step: int, busy_s: float) -> None:
        """The transport handed a message to ZMQ (or gave up on it): count it or keep the failure."""
        self._in_flight.release()
        if fut.cancelled():
            self._fail(TransportError("send cancelled (transport closed)"), step)
        elif (e := fut.exception()) is not None:
            self._fail(e, step)
        else:
            with self._lock:
                self._counters.messages += 1
                self._counters.bytes += fut.result()
                self._counters.busy_s += busy_s
        self._settle()

    def _fail(self, e: BaseException, step: int) -> None:
        logger.warning("hop to %s failed at step %d: %s", self.peer, step, e)
        with self._lock:
            if self._error is None:
                self._error = e

    def _settle(self) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()
