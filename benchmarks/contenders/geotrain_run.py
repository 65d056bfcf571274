"""Contender 4, geotrain: planned pipelines + hierarchical DiLoCo + codecs, as a user would run it.

Processes (each in its region when there are namespaces): ``geotrain dht`` in
the first region, one ``geotrain peer`` per peer (with the scenario's one-way
delay in the transport, ``--emulate``, only when the kernel-level delay layer is
not active; bandwidth too with ``--emulate-bandwidth`` when the kernel does not
shape it), and the coordinator ``geotrain run --json``
in the first region. The clock starts when every peer of the first plan has
built its worker and can train (the latest of their ``plan`` events' times, as
the other contenders' clocks start at their barrier once model and process
group are set up; the time from the coordinator's ``plan`` event to then is
``setup_s``) and stops at the first ``progress`` event in which every peer of
the plan reports done; the kernel counters are read at the coordinator's
``plan`` event (setup bytes count as the run's) and at the end.
The job's ``stop.steps`` may lie past the budget (``budget_steps``): the first
progress line where every peer has passed the budget gives the fixed-budget
time and counters, and past it each new complete checkpoint goes to
``reached``; when it says the target loss is reached the coordinator gets
SIGTERM (it stops the job and writes its report) and the clock stops there.

Checkpoints: the job sets ``checkpoint.dir``, so after every round each stage
group writes its committed global blocks (``geotrain.peers.checkpoint``); a
step whose entries cover the whole model is one checkpoint of the global
model, stamped with its newest manifest's modification time.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.contenders.launch import Network, Procs, diff

logger = logging.getLogger(__name__)

DONE = ("done", 2.0)  # a peer's progress status once it reached the stop step (PeerStatus.DONE; 2.0 before it)


@dataclass
class GeotrainRun:
    wall_s: float
    report: dict[str, Any]
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    kernel_bytes: dict[str, Any] | None = None
    kernel_setup_bytes: dict[str, Any] | None = None
    checkpoint_note: str | None = None
    budget_s: float | None = None
    kernel_budget_bytes: dict[str, Any] | None = None
    stopped: str = "cap"  # "target": stopped once a checkpoint reached the target loss
    setup_s: float | None = None  # the coordinator's plan -> every peer's worker built (outside wall_s)


def to_toml(job: Mapping[str, Mapping[str, Any]]) -> str:
    """A job dict (sections of scalars) as TOML; None values are left out (the default applies)."""
    lines: list[str] = []
    for section, values in job.items():
        lines.append(f"[{section}]")
        for k, v in values.items():
            if v is None:
                continue
            if isinstance(v, bool):
                lines.append(f"{k} = {'true' if v else 'false'}")
            elif isinstance(v, (int, float)):
                lines.append(f"{k} = {v!r}")
            elif isinstance(v, str):
                lines.append(f"{k} = {json.dumps(v)}")
            else:
                raise TypeError(f"job.{section}.{k}: only scalars go into the job file; got {type(v).__name__}")
        lines.append("")
    return "\n".join(lines)


def _first_plan(peer: Any, timeout: float) -> dict[str, Any]:
    """The peer's first ``plan`` (worker built) or ``spare`` event."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        e = peer.next_event(min(left, 0.5))
        if e is not None and e.get("event") in ("plan", "spare"):
            return dict(e)
    raise TimeoutError(f"{peer.name}: no plan or spare event within {timeout:.0f}s; last output: {peer.lines[-5:]}")


def run_geotrain(
    job: dict[str, Any], *, network: Network, regions: list[str], prices: Mapping[str, float],
    scenario_path: Path, work_dir: Path, timeout_s: float, job_id: str,
    budget_steps: int | None = None, reached: Callable[[dict[str, Any]], bool] | None = None,
) -> GeotrainRun:
    """Start a bootstrap, ``len(regions)`` peers and the coordinator; train the job; return what it measured."""
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    job_path = work_dir / "job.toml"
    job_path.write_text(to_toml(job))
    report_dir = work_dir / "report"
    home = regions[0]
    with Procs(network, stderr_dir=str(work_dir)) as procs:
        before_setup = network.counters()
        boot = procs.start_in("dht", "geotrain", ["dht", "--host", network.host(home)], region=home)
        maddrs = boot.wait_event("ready", left())["maddrs"]
        peers = []
        for i, region in enumerate(regions):
            cmd = ["peer", "--initial-peers", *maddrs, "--region", region, "--host", network.host(region),
                   "--threads", "1", "--probe-every", "600", "--price", str(prices.get(region, 1.0)),
                   "--job", job_id]
            if not network.kernel_delayed:  # the kernel-level delay layer, when active, already delays every packet
                cmd += ["--emulate", str(scenario_path)]
            if not network.kernel_shaped:
                cmd.append("--emulate-bandwidth")
            peers.append(procs.start_in(f"peer{i}-{region}", "geotrain", cmd, region=region))
        for p in peers:
            p.wait_event("ready", left())
        coord = procs.start_in("coordinator", "geotrain",
                            ["run", str(job_path), "--initial-peers", *maddrs, "--job-id", job_id,
                             "--report-dir", str(report_dir), "--host", network.host(home), "--json"], region=home)
        plan = coord.wait_event("plan", left())
        at_go, t_plan, t_plan_wall = network.counters(), time.monotonic(), time.time()
        # the clock starts once every peer built its worker (model, data, state) and can train
        ready = [_first_plan(p, left()) for p in peers]
        t_go_wall = max([t_plan_wall, *(float(e["time"]) for e in ready if "time" in e)])
        t_go = t_plan + (t_go_wall - t_plan_wall)
        at_end: dict[str, dict[str, int]] | None = None
        at_budget: dict[str, dict[str, int]] | None = None
        t_end: float | None = None
        t_budget: float | None = None
        stopped = "cap"
        scanned: set[str] = set()
        while True:
            e = coord.next_event(min(left(), 1.0))
            if time.monotonic() >= deadline:
                raise TimeoutError(f"geotrain did not finish within {timeout_s:.0f}s; last: {coord.lines[-5:]}")
            if e is None:
                continue
            if t_end is None and e.get("event") == "progress":
                peers_p = e.get("peers", {}).values()
                st = [v.get("status") for v in peers_p]
                steps = [int(v.get("step") or 0) for v in peers_p]
                if (budget_steps is not None and t_budget is None and len(steps) >= len(regions)
                        and min(steps) >= budget_steps):
                    at_budget, t_budget = network.counters(), time.monotonic()
                if t_budget is not None and reached is not None:
                    fresh, _ = read_checkpoints(job, job_id, int(plan.get("pipelines") or 1), t_go_wall, skip=scanned)
                    # only the newest: evaluating every one would lag behind training (the curve gets them all later)
                    if fresh and reached(max(fresh, key=lambda c: c["tokens"])):
                        at_end, t_end, stopped = network.counters(), time.monotonic(), "target"
                        coord.signal(signal.SIGTERM)  # the coordinator stops the job and writes its report
                        continue
                if len(st) >= len(regions) and all(s in DONE for s in st):
                    at_end, t_end = network.counters(), time.monotonic()
            if e.get("event") == "report":
                break
        if t_end is None:  # the coordinator saw every peer done between two progress lines
            at_end, t_end = network.counters(), time.monotonic()
    report = json.loads((report_dir / "report.json").read_text())
    pipelines = len((report.get("plans") or [{}])[-1].get("pipelines") or [])
    checkpoints, note = read_checkpoints(job, report["summary"]["job_id"], pipelines, t_go_wall)
    if budget_steps is not None and t_budget is None and stopped != "target":
        at_budget, t_budget = at_end, t_end  # the run ended at (or before) the budget
    return GeotrainRun(wall_s=t_end - t_go, report=report, checkpoints=checkpoints, checkpoint_note=note,
                       kernel_bytes=diff(at_end, at_go), kernel_setup_bytes=diff(at_go, before_setup),
                       budget_s=None if t_budget is None else t_budget - t_go,
                       kernel_budget_bytes=diff(at_budget, at_go), stopped=stopped, setup_s=t_go - t_plan)


def read_checkpoints(job: dict[str, Any], job_id: str, pipelines: int, t_go_wall: float,
                     skip: set[str] | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """Complete checkpoints as ``[{t_s, tokens, params}]``; a note instead when there are none.

    With ``skip``: steps whose directory is in it are left out, and the
    complete ones read now are added to it (to read new checkpoints during a run).
    """
    root = Path(job["checkpoint"]["dir"])
    try:
        from geotrain.peers import checkpoint
    except ImportError:
        return [], "geotrain.peers.checkpoint is missing: only the final global model is evaluated"
    from geotrain.config import job_from_dict

    model = job_from_dict(job).model
    num_blocks = model.block_model(int(job["job"]["seed"])).num_blocks
    tokens_per_step = pipelines * job["pipeline"]["micro_batch_size"] * job["pipeline"]["microbatches"] * \
        model.context
    out = []
    for d in sorted(root.glob("step-*")):
        if skip is not None and d.name in skip:
            continue
        manifests = list(d.glob("b*-*.json"))
        if not manifests:
            continue
        step = int(d.name.split("-")[1])
        try:
            state = checkpoint.load(root, step, job_id=job_id)
        except Exception as e:  # noqa: BLE001 (a half-written step is skipped, as the resume path does)
            logger.info("checkpoint %s skipped: %s", d, e)
            continue
        covered = {int(n.split(".")[1]) for n in state.params if n.startswith("blocks.")}
        if covered and len(covered) < num_blocks:
            continue
        if skip is not None:
            skip.add(d.name)
        # one written before the last peer was ready counts at the clock's start
        t = max(0.0, max(m.stat().st_mtime for m in manifests) - t_go_wall)
        out.append({"t_s": t, "tokens": step * tokens_per_step, "params": state.params})
    note = None if out else f"no complete checkpoints under {root}: only the final global model is evaluated"
    return out, note
