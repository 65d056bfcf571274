"""hivemind's DHT process, made to die with its parent and take ``p2pd`` along.

``hivemind.DHT`` runs its node in a forked child, which in turn runs the Go
``p2pd`` daemon. If the parent is killed (SIGKILL), nothing tells the child; if
the child is killed with SIGTERM, its default action skips hivemind's cleanup
and leaves ``p2pd`` orphaned. :class:`SwarmDHT` closes both gaps on Linux:

- the child asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``);
- on SIGTERM the child terminates ``p2pd`` itself before exiting.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from types import FrameType
from typing import Any

from hivemind import DHT

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class SwarmDHT(DHT):
    """A ``hivemind.DHT`` whose process (and its ``p2pd``) never outlives the process that started it."""

    def run(self) -> None:
        _set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != self._parent_pid:  # the parent died before prctl took effect
            os._exit(1)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        super().run()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        node: Any = getattr(self, "_node", None)
        child = getattr(getattr(node, "p2p", None), "_child", None)
        pid = getattr(child, "pid", None)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        os._exit(128 + signum)


async def p2pd_pid(_dht: DHT, node: Any) -> int | None:
    """(Runs inside the DHT process, via ``DHT.run_coroutine``.) The pid of its ``p2pd``."""
    child = getattr(getattr(node, "p2p", None), "_child", None)
    return getattr(child, "pid", None)


def terminate_p2pd(pid: int) -> bool:
    """SIGTERM ``pid`` if it is still a running ``p2pd`` (the cmdline check guards against pid reuse)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"p2pd" not in f.read().split(b"\0", 1)[0]:
                return False
        os.kill(pid, signal.SIGTERM)
    except (OSError, ProcessLookupError):
        return False
    logger.warning("terminated an orphaned p2pd (pid %d) whose DHT process had died", pid)
    return True
