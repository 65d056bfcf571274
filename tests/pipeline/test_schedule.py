from __future__ import annotations

import pytest

from geotrain.errors import ConfigError
from geotrain.pipeline.schedule import make_schedule, max_in_flight_of


def _simulate(kind: str, stages: int, mbs: int, cap: int | None) -> int:
    """Run all stages' op lists against each other; return the number of rounds, or fail on deadlock."""
    ops = [make_schedule(kind, stage=s, num_stages=stages, microbatches=mbs, max_in_flight=cap) for s in range(stages)]
    pos = [0] * stages
    done: set[tuple[str, int, int]] = set()
    rounds = 0
    while any(p < len(o) for p, o in zip(pos, ops, strict=True)):
        progressed = []
        for s in range(stages):
            if pos[s] == len(ops[s]):
                continue
            op, i = ops[s][pos[s]]
            if op == "F":
                ready = s == 0 or ("F", s - 1, i) in done
            else:
                ready = ("F", s, i) in done and (s == stages - 1 or ("B", s + 1, i) in done)
            if ready:
                progressed.append((op, s, i))
        assert progressed, f"deadlock: {kind} S={stages} M={mbs} cap={cap} at {pos}"
        for op, s, i in progressed:
            done.add((op, s, i))
            pos[s] += 1
        rounds += 1
    return rounds


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,mbs", [(1, 1), (1, 4), (2, 1), (3, 4), (4, 8), (5, 3)])
@pytest.mark.parametrize("cap", [None, 1, 2])
def test_schedules_are_complete_and_deadlock_free(kind: str, stages: int, mbs: int, cap: int | None) -> None:
    for s in range(stages):
        ops = make_schedule(kind, stage=s, num_stages=stages, microbatches=mbs, max_in_flight=cap)
        assert sorted(ops) == sorted([("F", i) for i in range(mbs)] + [("B", i) for i in range(mbs)])
        # forwards and backwards each in microbatch order; a backward after its forward
        assert [i for op, i in ops if op == "F"] == list(range(mbs))
        assert [i for op, i in ops if op == "B"] == list(range(mbs))
        if kind == "1f1b":
            bound = min(stages - s, mbs) if cap is None else min(stages - s, mbs, cap)
            assert max_in_flight_of(ops) == bound
        else:
            assert max_in_flight_of(ops) == mbs
    _simulate(kind, stages, mbs, cap)


def test_1f1b_shape_and_bubble() -> None:
    assert make_schedule("1f1b", stage=0, num_stages=3, microbatches=4) == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3),
    ]
    assert make_schedule("1f1b", stage=2, num_stages=3, microbatches=2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    # with unit op times both take 2 (M + S - 1) rounds: the bubble is the same, memory is not
    assert _simulate("1f1b", 4, 8, None) == _simulate("gpipe", 4, 8, None) == 2 * (8 + 4 - 1)


def test_bad_schedule_arguments() -> None:
    with pytest.raises(ConfigError, match="'1f1b' or 'gpipe'"):
        make_schedule("zb", stage=0, num_stages=2, microbatches=2)
    with pytest.raises(ConfigError, match="max_in_flight"):
        make_schedule("1f1b", stage=0, num_stages=2, microbatches=2, max_in_flight=0)
    with pytest.raises(ConfigError, match="out of range"):
        make_schedule("1f1b", stage=2, num_stages=2, microbatches=2)
