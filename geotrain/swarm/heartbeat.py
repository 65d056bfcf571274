"""The heartbeat: a peer proves it is alive by republishing its record.

What is a heartbeat? One publication of the peer record, every ``period_s``,
with a DHT expiration of 3 periods and one RPC timeout (a renewal slowed by a
replica behind a congested link still lands in time). Nobody sends "I left": a
peer that dies simply stops refreshing, and its record expires within that.
Missing one or two beats (a slow DHT, a GC pause) does not make a live peer vanish.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from geotrain.errors import SwarmError

if TYPE_CHECKING:
    from geotrain.swarm.records import PeerRecord
    from geotrain.swarm.swarm import Swarm

logger = logging.getLogger(__name__)


class Heartbeat:
    """Background thread republishing ``make_record()`` through ``swarm`` every ``period_s``.

    ``beats`` counts publications a replica accepted; ``failures`` those that did
    not (logged, retried next period). ``stop()`` returns within about one DHT timeout.
    """

    def __init__(self, swarm: Swarm, make_record: Callable[[], PeerRecord], *, period_s: float) -> None:
        if period_s <= 0:
            raise ValueError(f"heartbeat period must be > 0 s; got {period_s}")
        self._swarm = swarm
        self._make_record = make_record
        self.period_s = period_s
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._run, name="geotrain-heartbeat", daemon=True)
        self.beats = 0
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def wait_first(self, timeout: float) -> bool:
        """Block until the first publication was attempted; True if a replica accepted it."""
        self._first.wait(timeout)
        return self.beats > 0

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout if timeout is not None else self._swarm.config.timeout_s + 1.0)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._swarm.publish_peer(self._make_record()):
                    self.beats += 1
                else:
                    self.failures += 1
            except (SwarmError, ValueError) as e:
                self.failures += 1
                logger.warning("heartbeat failed (will retry in %.1fs): %s", self.period_s, e)
            finally:
                self._first.set()
            self._stop.wait(self.period_s)
