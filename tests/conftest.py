from __future__ import annotations

from collections.abc import Iterator

import pytest

from geotrain.testing.procs import ChildGroup


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
