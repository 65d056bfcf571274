"""News: a data-plane hint that a DHT record changed, so its reader looks now rather than at its next poll.

Why? Peers follow the job's plan, and the coordinator follows the peers'
progress, by polling the DHT every ``poll_s``. A new plan (a replan after a
death, a moved stop step) then waits up to one poll before peers see it, and a
peer that finished or stalled waits up to one poll (plus its progress period)
before the coordinator does. With news, the writer sends a tiny request
straight to the readers' transports after it has written the record.

The DHT stays the only source of truth: news carries nothing but its kind,
and the reader reads the signed records as usual. A forged, repeated or lost
piece of news therefore costs at most one extra DHT read per ``min_gap_s``
(see :class:`NewsWaiter`), or one poll of delay.

- ``news.job``: coordinator -> every peer it sees that does not follow its job yet: a job was published;
- ``news.plan``: coordinator -> the plan's peers: a plan record changed;
- ``news.progress``: peer -> coordinator: this peer is done or stalled.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from geotrain.errors import GeotrainError
from geotrain.transport import Message, Transport

__all__ = ["JOB_NEWS", "PLAN_NEWS", "PROGRESS_NEWS", "Contact", "NewsWaiter", "serve_news", "send_news"]

logger = logging.getLogger(__name__)

JOB_NEWS = "news.job"
PLAN_NEWS = "news.plan"
PROGRESS_NEWS = "news.progress"


@dataclass(frozen=True)
class Contact:
    """Where to send news: a peer id and its data-plane address (and CURVE key in closed swarms)."""

    peer_id: str
    endpoint: str
    region: str | None = None
    curve_public_key: str | None = None


class NewsWaiter:
    """A poll loop's pause: returns after ``poll_s`` or as soon as news comes, reads at most every ``min_gap_s``.

    ``stop`` ends any wait; call :meth:`poke` after setting it so a waiting loop returns at once. The gap
    between reads is kept by waiting on ``stop``, timed by ``clock`` (tests give both on virtual time).
    """

    def __init__(
        self, stop: threading.Event, *, poll_s: float, min_gap_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stop, self.poll_s, self.min_gap_s, self.clock = stop, poll_s, min_gap_s, clock
        self._news = threading.Event()
        self.had_news = False  # whether the last wait ended on news (not on its poll period)
        self._last = float("-inf")
        self._count_lock = threading.Lock()
        self.received = 0  # news received (handler threads poke concurrently)

    def poke(self) -> None:
        with self._count_lock:
            self.received += 1
        self._news.set()

    def wait(self, at_most_s: float | None = None) -> bool:
        """Pause until the next read is due (``poll_s``, or ``at_most_s`` when sooner); False once ``stop`` is set."""
        self.had_news = self._news.wait(self.poll_s if at_most_s is None else max(0.0, min(self.poll_s, at_most_s)))
        gap = self.min_gap_s - (self.clock() - self._last)
        if gap > 0:
            self.stop.wait(gap)  # news faster than this is merged into one read
        self._news.clear()
        self._last = self.clock()
        return not self.stop.is_set()


def serve_news(transport: Transport, kind: str, waiter: NewsWaiter) -> None:
    """Answer ``kind`` news on ``transport``: wake ``waiter`` and acknowledge."""

    def on_news(msg: Message) -> Message:
        waiter.poke()
        return Message(kind=f"{kind}.ack")

    transport.serve(kind, on_news)


def send_news(transport: Transport, contacts: Iterable[Contact], kind: str, *, timeout_s: float = 2.0) -> threading.Thread:
    """Tell each contact, in parallel and in the background; a contact that does not answer is only logged.

    Returns the background thread (join it in tests; nothing else needs to wait).
    """
    todo = [c for c in contacts if c.peer_id != transport.peer_id and c.endpoint]

    def tell(c: Contact) -> None:
        key = c.curve_public_key.encode() if c.curve_public_key else None
        try:
            transport.connect(c.peer_id, c.endpoint, region=c.region or "", curve_server_key=key)
            transport.request(c.peer_id, Message(kind=kind), timeout=timeout_s)
        except GeotrainError as e:  # it polls anyway: news only shortens the wait
            logger.debug("news %s to %s not delivered: %s", kind, c.peer_id, e)

    def run() -> None:
        if not todo:
            return
        with concurrent.futures.ThreadPoolExecutor(min(16, len(todo)), thread_name_prefix="gt-news") as pool:
            list(pool.map(tell, todo))

    t = threading.Thread(target=run, name="gt-news", daemon=True)
    t.start()
    return t
