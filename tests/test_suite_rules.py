"""Rules the suite keeps about itself: no test is marked to be rerun until it passes, and no unit test
bounds wall time from above."""

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


_CLOCKS = {"monotonic", "perf_counter", "time"}
_ELAPSED = {"took", "elapsed", "waited", "seconds"}


def _module_marks(tree: ast.Module) -> set[str]:
    """The marks of a module's ``pytestmark``."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return set(_marker_names(node))
    return set()


def _upper_bounds_on_wall_time(tree: ast.AST) -> list[int]:
    """Lines of asserts that bound elapsed wall time from above: ``clock() - t0 < x``, ``took < x``,
    ``r.seconds < x``, ``seen["waited"] < x``."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in ast.walk(node.test):
            if not isinstance(cmp, ast.Compare):
                continue
            operands = [cmp.left, *cmp.comparators]
            for op, left, right in zip(cmp.ops, operands, operands[1:], strict=False):
                timed = left if isinstance(op, (ast.Lt, ast.LtE)) else right if isinstance(op, (ast.Gt, ast.GtE)) else None
                if timed is None:
                    continue
                names = {n.attr for n in ast.walk(timed) if isinstance(n, ast.Attribute)}
                names |= {n.id for n in ast.walk(timed) if isinstance(n, ast.Name)}
                names |= {n.value for n in ast.walk(timed) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
                called = {n.func.attr for n in ast.walk(timed) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
                if called & _CLOCKS or names & _ELAPSED:
                    lines.append(node.lineno)
    return lines


def test_unit_tests_bound_no_wall_time_from_above() -> None:
    # a unit test that a loaded machine can fail by being slow says nothing about the code: check what the code
    # decided (a reason, an event, a virtual clock) instead. Tests of real processes and of the link emulator
    # (whose subject is time) are exempt; a lower bound (a timeout or a rate cap waited out) cannot fail by load
    offenders = []
    for path in sorted(TESTS.rglob("test_*.py")):
        rel = path.relative_to(TESTS)
        tree = ast.parse(path.read_text(), filename=str(path))
        if rel.parts[0] in ("emulate", "benchmarks") or "multiprocess" in _module_marks(tree):
            continue
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef) and "multiprocess" not in _marker_names(ast.Module(fn.decorator_list, [])):
                offenders += [f"{rel}:{line}" for line in _upper_bounds_on_wall_time(fn)]
    assert not offenders, offenders
