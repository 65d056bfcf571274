from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from geotrain.local.procs import ChildGroup
from geotrain.transport import Transport, TransportConfig


@pytest.fixture
def children() -> Iterator[ChildGroup]:
    """Launch ``geotrain`` child processes; every one is reaped when the test ends.

    The reaping gives each child 2 s after SIGTERM, then kills its process group: what a test checks
    happened before its teardown, and a bootstrap ``geotrain dht`` takes ~8 s to stop (hivemind's DHT
    shutdown), which cost every multi-process test 5 s of teardown with the default grace. The tests
    of a clean stop on a signal wait for it themselves (tests/faults/test_process_signals.py).
    Children fork from a server that imported torch, hivemind and geotrain once (``preload``): each saves
    the ~2.7 CPU-seconds of those imports, on a suite whose multi-process tests are CPU-bound.
    """
    group = ChildGroup(preload=True)
    try:
        yield group
    finally:
        group.close(grace=2.0)


@pytest.fixture
def net() -> Iterator[Callable[..., Transport]]:
    """``net(name, region="")``: a started loopback transport with peer id ``name``; every one is closed when
    the test ends."""
    made: list[Transport] = []

    def make(name: str, region: str = "") -> Transport:
        t = Transport(TransportConfig(), peer_id=name, region=region).start()
        made.append(t)
        return t

    try:
        yield make
    finally:
        for t in made:
            t.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A backstop behind pytest-timeout: a test still running 2 minutes past its timeout (each attempt's) ends the session.

    pytest-timeout raises in the main thread; a test blocked where that cannot reach (a thread pool waiting
    on a stalled library thread, a C call) would hang the whole run. Then every thread's stack is printed
    and the process exits, so the run fails at once, naming where it hung.
    """
    import faulthandler

    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 0)
    if limit > 0:
        faulthandler.dump_traceback_later(limit + 120.0, exit=True)
    try:
        yield
    finally:
        if limit > 0:
            faulthandler.cancel_dump_traceback_later()
