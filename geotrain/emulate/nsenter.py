"""Open sockets inside a named network namespace from this process (Linux, root).

The network namespace is a per-thread attribute: ``setns(fd, CLONE_NEWNET)``
moves only the calling thread, and a socket belongs for life to the namespace
it was created in. So :func:`socket_in` switches the calling thread into
``/var/run/netns/<name>``, creates the socket, and switches back before
returning; the rest of the process never notices. This lets one test process
hold a listener in region A and a client in region B without child processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import socket
from collections.abc import Iterator

from geotrain.errors import EmulationError

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"

_libc: ctypes.CDLL | None = None


def _setns(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise EmulationError(f"setns(CLONE_NEWNET) failed: {os.strerror(err)} (needs root / CAP_SYS_ADMIN)")


@contextlib.contextmanager
def entered(netns: str) -> Iterator[None]:
    """Run the body with the calling thread in network namespace ``netns``; always switch back."""
    try:
        target = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise EmulationError(f"network namespace {netns!r} does not exist ({e.strerror}); is the emulation up?") from None
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        os.close(target)
        raise
    try:
        _setns(target)
        try:
            yield
        finally:
            # failing to return would leave this thread's later sockets in the wrong network
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def socket_in(netns: str, family: int = socket.AF_INET, type: int = socket.SOCK_STREAM) -> socket.socket:
    """A new socket that lives in network namespace ``netns``."""
    with entered(netns):
        return socket.socket(family, type)
