"""A peer's status travels as the typed ``ProgressRecord.status`` (geotrain.swarm.records.PeerStatus).

The coordinator's stall and done detection, the progress event, the live view and the metrics
endpoint all read that field; an older peer's record (the status as a float code in ``stats``)
still passes the DHT's validators and decodes to the same typed status.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from rich.console import Console

from geotrain.config import job_from_dict
from geotrain.coordinator.coordinator import Coordinator, CoordinatorConfig
from geotrain.coordinator.decide import done, stalled
from geotrain.coordinator.live import LiveView
from geotrain.coordinator.metrics import status_name
from geotrain.plan import JobPlan, StageSlot
from geotrain.swarm import Swarm, SwarmConfig
from geotrain.swarm.identity import Identity
from geotrain.swarm.records import LEGACY_STATUS_CODES, PeerStatus, ProgressRecord
from tests.swarm.test_records import chain, make_record, owner  # noqa: F401 (fixtures)


def progress(peer_id: str, **changes: object) -> ProgressRecord:
    fields: dict[str, object] = dict(
        peer_id=peer_id, job_id="j", plan_version=1, step=3, loss=2.0, tokens=10, round=0, bytes_sent=0,
        bytes_received=0, updated_at=time.time(),
    )  # fmt: skip
    fields.update(changes)
    return ProgressRecord(**fields)  # type: ignore[arg-type]


def coordinator(tmp_path: Path, events: list[dict[str, object]] | None = None) -> Coordinator:
    job = job_from_dict({"job": {"name": "t"}, "model": {"preset": "tiny"}})
    sink = events.append if events is not None else None
    c = Coordinator(CoordinatorConfig(job_id="j", report_dir=tmp_path), job, swarm=Swarm(SwarmConfig(swarm="t")),
                    emit=sink)
    c.plan = JobPlan(job_id="j", version=1, num_blocks=2, stop_step=10, pipelines=(
        (StageSlot(peer="A", start=0, end=1), StageSlot(peer="B", start=1, end=2)),
    ))
    return c


def test_new_record_round_trips_the_validator_chain_with_a_plain_string(owner: Identity, chain) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from hivemind.utils import MSGPackSerializer

    rec = progress(owner.peer_id, status=PeerStatus.STALLED, stats={"utilisation": 0.5})
    wire = rec.to_wire()
    assert type(wire["status"]) is str and wire["status"] == "stalled"
    record = make_record(owner, "progress", wire, signer=chain)
    assert chain.validate(record)
    back = ProgressRecord.model_validate(MSGPackSerializer.loads(chain.strip_value(record)), strict=True)
    assert back == rec and back.status is PeerStatus.STALLED


@pytest.mark.parametrize("code", sorted(LEGACY_STATUS_CODES))
def test_an_older_record_with_only_the_float_code_still_passes_and_decodes(
    owner: Identity, chain, code: float  # type: ignore[no-untyped-def]  # noqa: F811
) -> None:
    old = progress(owner.peer_id).to_wire()
    del old["status"], old["shards"], old["links_in"]  # an older peer wrote none (each came after the one before)
    old["stats"] = {"status": code, "utilisation": 0.25}
    assert chain.validate(make_record(owner, "progress", old, signer=chain))
    rec = ProgressRecord.model_validate(old, strict=True)
    assert rec.status is LEGACY_STATUS_CODES[code]
    assert rec.stats == {"utilisation": 0.25}  # the code moved to the typed field
    # 4.0 (an idle peer following a job) was decoded by nobody before
    assert LEGACY_STATUS_CODES[4.0] is PeerStatus.IDLE


def test_an_unknown_status_is_refused() -> None:
    with pytest.raises(ValidationError):
        ProgressRecord.model_validate({**progress("A").to_wire(), "status": "resting"}, strict=True)
    old = progress("A").to_wire()
    del old["status"]
    old["stats"] = {"status": 7.0}
    with pytest.raises(ValidationError, match="no status code"):
        ProgressRecord.model_validate(old, strict=True)


def test_stall_and_done_detection_read_the_typed_field(tmp_path: Path) -> None:
    plan = coordinator(tmp_path).plan
    assert plan is not None
    # a figure that happens to be called "status" in stats is not the peer's status
    seen = {"A": progress("A", status=PeerStatus.STALLED), "B": progress("B", stats={"status": 1.0},
                                                                          status=PeerStatus.TRAINING)}
    assert stalled(plan, seen) == {"A"}
    assert stalled(plan, {"A": progress("A", status=PeerStatus.STALLED, plan_version=0)}) == set()  # an older plan
    assert not done(plan, {"A": progress("A", status=PeerStatus.DONE), "B": progress("B", status=PeerStatus.TRAINING)})
    assert done(plan, {p: progress(p, status=PeerStatus.DONE) for p in "AB"})
    assert not done(plan, {p: progress(p, status=PeerStatus.DONE, stats={"status": 2.0}, plan_version=0)
                           for p in "AB"})


def test_progress_event_live_view_and_metrics_show_the_typed_status(tmp_path: Path) -> None:
    events: list[dict[str, object]] = []
    c = coordinator(tmp_path, events)
    c._account({}, {"A": progress("A", status=PeerStatus.STALLED), "B": progress("B", status=PeerStatus.SPARE)}, 0.0)
    (event,) = [e for e in events if e["event"] == "progress"]
    assert event["peers"] == {  # type: ignore[comparison-overlap]
        "A": {"step": 3, "loss": 2.0, "round": 0, "status": "stalled"},
        "B": {"step": 3, "loss": 2.0, "round": 0, "status": "spare"},
    }
    out = io.StringIO()
    view = LiveView(Console(file=out, width=120, color_system=None))
    view(event)
    view.console.print(view._render())
    rows = {line.split()[1]: line for line in out.getvalue().splitlines() if line.startswith("│ A ") or
            line.startswith("│ B ")}
    assert "stalled" in rows["A"] and "spare" in rows["B"], out.getvalue()
    assert status_name("done") == "done" and status_name(PeerStatus.IDLE) == "idle"
    assert status_name(1.0) == "unknown" and status_name(None) == "unknown"
