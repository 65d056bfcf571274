from __future__ import annotations

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


_RERUNS: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the error of every attempt that a rerun replaced: a rerun that passes must not hide its cause."""
    if report.outcome == "rerun":
        _RERUNS.append((report.nodeid, report.longreprtext[-4000:]))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After the run: each rerun test's first error (its last 4,000 characters)."""
    if not _RERUNS:
        return
    terminalreporter.section("errors of attempts that were rerun")
    for nodeid, text in _RERUNS:
        terminalreporter.write_line(f"--- {nodeid}")
        terminalreporter.write_line(text)
