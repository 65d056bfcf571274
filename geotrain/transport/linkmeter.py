"""Passive link figures from real traffic: how long a link held the messages that crossed it.

Why passive? While a job trains, a peer sends no bulk probes (the data plane's
bytes are the job's), yet a link can degrade: a cloud's cross-region path gets
congested, a home uplink is shared. The pipeline's own messages measure the
link for free.

How? The sender stamps each hop message with its own monotonic clock when it
hands it to the transport (``meta["sent_at"]``). The receiver's I/O thread
notes when each whole message arrived. Its *transit* ``arrived - sent_at``
holds the two clocks' offset, which is unknown but steady, so only transits
relative to the sender's fastest one are used:

- the *baseline* is the smallest transit seen from this sender, allowed to
  rise by ``drift`` (100 ppm, beyond any real clock's drift) per second since
  it was seen: the offset plus the quickest trip the link ever gave;
- a message's *delay* is its transit above the baseline. A message the link
  *held* (delay of at least ``min_gap_s``, 20 ms: shorter ones are the size of
  a loaded machine's scheduling delays) waited in the link's queue, behind our
  own messages or behind a congested path;
- the link was busy with message k from when it could start (handed over, in
  the receiver's clock ``sent_at + baseline``, and the message before it
  through) until it arrived; the figure is the held messages' bytes over their
  busy seconds. That is exact for a FIFO link that queues messages (each one
  arrives ``bytes / bandwidth`` after the one before) and still right when TCP
  delivers several at once after a loss (a message that arrives with the one
  before adds bytes and no time, the wait before them counts once).

A link that keeps up holds nothing and gives no figure, and a healthy run adds
no bytes to any record. A stalled receiver thread holds a few messages, which
are not a figure: a sender's :class:`InboundLink` has a ``bandwidth_bps`` only
with at least ``min_samples`` held messages making at least
``min_held_share`` of the window's messages, and held for ``min_gap_s`` each
on average (a link fast enough to carry a message in less is not measured
here, nor does it need to be: it is not what limits a pipeline).

The figure is a link's goodput for our traffic: on a heavily shaped link TCP's
losses and retransmissions bring it below the shaper's rate (a 20 kB/s link
read 13-16 kB/s for 10 kB activations).
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field

__all__ = ["InboundLink", "InboundMeter", "STAMP"]

STAMP = "sent_at"  # the meta key a sender stamps with its monotonic clock


@dataclass(frozen=True)
class InboundLink:
    """What the messages one sender stamped say about its link to this peer, over the window."""

    messages: int  # stamped messages in the window
    queued: int  # of them, those the link held (delay of at least min_gap_s)
    bandwidth_bps: float | None  # bytes/s from the held ones; None unless they are enough to be a figure


@dataclass(frozen=True)
class _Arrival:
    at: float  # receiver's monotonic clock
    held: bool
    nbytes: int
    busy_s: float  # how long the link was busy with it


@dataclass
class _Sender:
    last_sent: float | None = None
    last_arrived: float | None = None
    base: tuple[float, float] | None = None  # (smallest transit, when it was seen)
    window: collections.deque[_Arrival] = field(default_factory=collections.deque)


class InboundMeter:
    """Per-sender link figures from stamped messages (see the module docstring). Not thread-safe: the owner locks."""

    def __init__(self, *, window_s: float = 20.0, max_messages: int = 256, min_samples: int = 4,
                 min_held_share: float = 0.5, min_gap_s: float = 0.02, drift: float = 1e-4,
                 max_senders: int = 256) -> None:
        self.window_s, self.max_messages, self.min_gap_s, self.drift = window_s, max_messages, min_gap_s, drift
        self.min_samples, self.min_held_share = min_samples, min_held_share
        self.max_senders = max_senders
        self._senders: collections.OrderedDict[str, _Sender] = collections.OrderedDict()

    def arrived(self, sender: str, sent_at: object, nbytes: int, *, now: float | None = None) -> None:
        """One message from ``sender`` arrived whole now; ``sent_at`` is its stamp (anything else is ignored)."""
        if not isinstance(sent_at, (int, float)) or isinstance(sent_at, bool) or not math.isfinite(sent_at):
            return
        sent = float(sent_at)
        now = time.monotonic() if now is None else now
        s = self._senders.get(sender)
        if s is None or (s.last_sent is not None and sent < s.last_sent):
            # a new sender, or its stamps went backwards (a restarted peer, another clock): start afresh
            s = self._senders[sender] = _Sender()
            while len(self._senders) > self.max_senders:  # a flood of forged sender names stays bounded
                self._senders.popitem(last=False)
        self._senders.move_to_end(sender)
        transit = now - sent
        base = None if s.base is None else s.base[0] + self.drift * (now - s.base[1])
        if base is None or transit < base:
            s.base, base = (transit, now), transit
        start = sent + base if s.last_arrived is None else max(sent + base, s.last_arrived)
        s.window.append(_Arrival(at=now, held=transit - base >= self.min_gap_s, nbytes=nbytes,
                                 busy_s=max(0.0, now - start)))
        s.last_sent, s.last_arrived = sent, max(now, s.last_arrived or now)
        while len(s.window) > self.max_messages:
            s.window.popleft()

    def links(self, *, now: float | None = None) -> dict[str, InboundLink]:
        """Each sender heard from within the window: its messages, held ones and bandwidth figure."""
        now = time.monotonic() if now is None else now
        out: dict[str, InboundLink] = {}
        for sender, s in list(self._senders.items()):
            while s.window and now - s.window[0].at > self.window_s:
                s.window.popleft()
            if not s.window:
                continue
            held = [a for a in s.window if a.held]
            busy = sum(a.busy_s for a in held)
            enough = (len(held) >= self.min_samples and len(held) >= self.min_held_share * len(s.window)
                      and busy >= self.min_gap_s * len(held))
            out[sender] = InboundLink(messages=len(s.window), queued=len(held),
                                      bandwidth_bps=sum(a.nbytes for a in held) / busy if enough else None)
        return out
