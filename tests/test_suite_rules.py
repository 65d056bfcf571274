"""Rules the suite keeps about itself: no test is marked to be rerun until it passes."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def _marker_names(node: ast.AST) -> list[str]:
    """The name of every ``pytest.mark.NAME`` (called or not) in ``node``."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark":
            out.append(n.attr)
    return out


def test_no_test_is_marked_to_be_rerun() -> None:
    # a failure is found and fixed, not rerun away: no flaky marker and no reruns argument anywhere
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names = _marker_names(tree)
        if "flaky" in names:
            offenders.append(f"{path.relative_to(TESTS)}: pytest.mark.flaky")
        for n in ast.walk(tree):
            if isinstance(n, ast.keyword) and n.arg in ("reruns", "reruns_delay"):
                offenders.append(f"{path.relative_to(TESTS)}:{n.value.lineno}: {n.arg}=")
    assert not offenders, offenders
