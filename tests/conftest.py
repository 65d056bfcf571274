from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest

from geotrain.testing.procs import ChildGroup
from geotrain.transport import Transport, TransportConfig


@pytest.fixture
def children() -> Iterator[ChildGroup]:
    """Launch ``geotrain`` child processes; every one is reaped when the test ends.

    The reaping gives each child 2 s after SIGTERM, then kills its process group: what a test checks
    happened before its teardown, and a bootstrap ``geotrain dht`` takes ~8 s to stop (hivemind's DHT
    shutdown), which cost every multi-process test 5 s of teardown with the default grace. The tests
    of a clean stop on a signal wait for it themselves (tests/faults/test_process_signals.py).
    """
    group = ChildGroup()
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


HEAVY_DIRS = ("emulate", "benchmarks")  # namespaces, kernel byte counters and whole benchmark runs


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``./dev test`` (pytest-xdist, ``--dist loadgroup``): every test that starts processes, namespaces or
    a benchmark joins one group, which one worker runs in collection order, as a serial run would; the
    in-process tests are spread over the other workers beside it.

    Why not spread everything: those tests load both cores by themselves (a bootstrap, peers and a
    coordinator), and two of them at once would double the load their deadlines were set for.
    """
    for item in items:
        folder = item.path.parent.name
        if item.get_closest_marker("multiprocess") or item.get_closest_marker("netns") or folder in HEAVY_DIRS:
            item.add_marker(pytest.mark.xdist_group("processes"))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup`` on a worker: the group must have reached the test ids, which is how pytest-xdist
    sends a group to one worker. With pytest 9 it does not (the id lives where xdist's rename cannot reach it), and
    the multi-process tests would silently run two at a time; stop at once instead, saying why."""
    config = session.config
    if not (hasattr(config, "workerinput") and getattr(config.option, "loadgroup", False)):
        return
    grouped = [i for i in session.items if i.get_closest_marker("xdist_group")]
    if grouped and not any(i.nodeid.endswith("@processes") for i in grouped):
        message = (f"pytest {pytest.__version__} with this pytest-xdist ignores --dist loadgroup (test ids keep no "
                   "'@group' suffix): install the dev extras' pytest (pip install -e '.[dev]') or run with -n 0")
        sys.stderr.write(f"\n{message}\n")  # a worker's error reaches the terminal only as an internal error
        raise pytest.UsageError(message)


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
    flaky = item.get_closest_marker("flaky")
    attempts = 1 + int(flaky.kwargs.get("reruns", 0)) if flaky else 1
    if limit > 0:
        faulthandler.dump_traceback_later(limit * attempts + 120.0, exit=True)
    try:
        yield
    finally:
        if limit > 0:
            faulthandler.cancel_dump_traceback_later()
