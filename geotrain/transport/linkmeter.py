"""Passive link figures from real traffic: how fast messages that queued behind each other arrived.

Why passive? While a job trains, a peer sends no bulk probes (the data plane's
bytes are the job's), yet a link can degrade: a cloud's cross-region path gets
congested, a home uplink is shared. The pipeline's own messages measure the
link for free.

How? The sender stamps each hop message with its own monotonic clock when it
hands it to the transport (``meta["sent_at"]``; only differences are used, so
the two peers' clocks need not agree). The receiver's I/O thread notes when
each whole message arrived. For two consecutive messages k-1, k from one
sender, with send gap ``ds`` and arrival gap ``da``:

- the link kept up (k left after k-1 was through): ``da`` is about ``ds``; that
  says only that the link is at least ``bytes_k / da`` fast, so it is no sample;
- k *queued* behind k-1 (it was sent while k-1 was still on the link): a FIFO
  link delivers k's last byte ``bytes_k / bandwidth`` after k-1's, so
  ``da = bytes_k / bandwidth`` and ``bytes_k / da`` is the link's bandwidth.

A message counts as queued when ``da > 1.5 ds + 2 ms`` (a margin for a busy
receiver's scheduling) and ``da >= min_gap_s`` (20 ms): a shorter gap is the
same size as a loaded machine's scheduling delays, so a link fast enough to
carry a message in less than that is never measured here (nor does it need
to be: it is not what limits a pipeline). A link that limits the pipeline queues most messages of
a step (1F1B keeps several in flight); a link that keeps up queues almost none,
and the few samples a stalled receiver thread makes are not a figure: a
sender's :class:`InboundLink` has a ``bandwidth_bps`` only with at least
``min_samples`` queued messages making at least ``min_queued_share`` of the
window's messages. The figure is the median of the queued samples.
"""

from __future__ import annotations

import collections
import math
import statistics
import time
from dataclasses import dataclass, field

__all__ = ["InboundLink", "InboundMeter", "STAMP"]

STAMP = "sent_at"  # the meta key a sender stamps with its monotonic clock


@dataclass(frozen=True)
class InboundLink:
    """What the messages one sender stamped say about its link to this peer, over the window."""

    messages: int  # stamped messages in the window
    queued: int  # of them, those that queued behind the one before
    bandwidth_bps: float | None  # bytes/s from the queued ones; None unless they are enough to be a figure


@dataclass
class _Sender:
    last: tuple[float, float] | None = None  # (sent_at, arrived_at) of the newest message
    # per message in the window: (arrived_at, bytes/s when it queued else None)
    window: collections.deque[tuple[float, float | None]] = field(default_factory=collections.deque)


class InboundMeter:
    """Per-sender dispersion of stamped messages (see the module docstring). Not thread-safe: the owner locks."""

    def __init__(self, *, window_s: float = 60.0, max_messages: int = 64, min_samples: int = 4,
                 min_queued_share: float = 0.3, min_gap_s: float = 0.02, max_senders: int = 256) -> None:
        self.window_s, self.max_messages, self.min_gap_s = window_s, max_messages, min_gap_s
        self.min_samples, self.min_queued_share = min_samples, min_queued_share
        self.max_senders = max_senders
        self._senders: collections.OrderedDict[str, _Sender] = collections.OrderedDict()

    def arrived(self, sender: str, sent_at: object, nbytes: int, *, now: float | None = None) -> None:
        """One message from ``sender`` arrived whole now; ``sent_at`` is its stamp (anything else is ignored)."""
        if not isinstance(sent_at, (int, float)) or isinstance(sent_at, bool) or not math.isfinite(sent_at):
            return
        now = time.monotonic() if now is None else now
        s = self._senders.get(sender)
        if s is None:
            s = self._senders[sender] = _Sender()
            while len(self._senders) > self.max_senders:  # a flood of forged sender names stays bounded
                self._senders.popitem(last=False)
        else:
            self._senders.move_to_end(sender)
        sample: float | None = None
        if s.last is not None:
            ds, da = sent_at - s.last[0], now - s.last[1]
            # ds < 0: the sender's stamps went backwards (a restarted peer, a forged stamp): no sample
            if ds >= 0 and da > 1.5 * ds + 0.002 and da >= self.min_gap_s:
                sample = nbytes / da
        s.last = (float(sent_at), now)
        s.window.append((now, sample))
        while len(s.window) > self.max_messages:
            s.window.popleft()

    def links(self, *, now: float | None = None) -> dict[str, InboundLink]:
        """Each sender heard from within the window: its messages, queued ones and bandwidth figure."""
        now = time.monotonic() if now is None else now
        out: dict[str, InboundLink] = {}
        for sender, s in list(self._senders.items()):
            while s.window and now - s.window[0][0] > self.window_s:
                s.window.popleft()
            if not s.window:
                continue
            samples = [x for _, x in s.window if x is not None]
            enough = len(samples) >= self.min_samples and len(samples) >= self.min_queued_share * len(s.window)
            out[sender] = InboundLink(messages=len(s.window), queued=len(samples),
                                      bandwidth_bps=statistics.median(samples) if enough else None)
        return out
