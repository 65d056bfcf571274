from __future__ import annotations

from collections.abc import Iterator

import pytest

from geotrain.testing.procs import ChildGroup


@pytest.fixture
def children() -> Iterator[ChildGroup]:
    """Launch ``geotrain`` child processes; every one is reaped when the test ends."""
    group = ChildGroup()
    try:
        yield group
    finally:
        group.close()
