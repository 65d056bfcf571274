"""Contender 4, geotrain: planned pipelines + hierarchical DiLoCo + codecs, as a user would run it.

Processes (each in its region when there are namespaces): ``geotrain dht`` in
the first region, one ``geotrain peer`` per peer (with the scenario's one-way
delay in the transport, ``--emulate``, only when the kernel-level delay layer is
not active; bandwidth too with ``--emulate-bandwidth`` when the kernel does not
shape it), and the coordinator ``geotrain run --json``
in the first region. The clock starts at the coordinator's ``plan`` event
(when training can begin) and stops at the first ``progress`` event in which
every peer of the plan reports done; the kernel counters are read at both.

Checkpoints: the job sets ``checkpoint.dir``, so after every round each stage
group writes its committed global blocks (``geotrain.peers.checkpoint``); a
step whose entries cover the whole model is one checkpoint of the global
model, stamped with its newest manifest's modification time.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.contenders.launch import Network, Procs, diff

logger = logging.getLogger(__name__)

DONE = 2.0  # a peer's progress status once it reached the stop step (geotrain.coordinator)


@dataclass
class GeotrainRun:
    wall_s: float
    report: dict[str, Any]
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    kernel_bytes: dict[str, Any] | None = None
    kernel_setup_bytes: dict[str, Any] | None = None
    checkpoint_note: str | None = None


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


def run_geotrain(
    job: dict[str, Any], *, network: Network, regions: list[str], prices: Mapping[str, float],
    scenario_path: Path, work_dir: Path, timeout_s: float, job_id: str,
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
        coord.wait_event("plan", left())
        at_go, t_go, t_go_wall = network.counters(), time.monotonic(), time.time()
        at_end: dict[str, dict[str, int]] | None = None
        t_end: float | None = None
        while True:
            e = coord.next_event(min(left(), 1.0))
            if time.monotonic() >= deadline:
                raise TimeoutError(f"geotrain did not finish within {timeout_s:.0f}s; last: {coord.lines[-5:]}")
            if e is None:
                continue
            if t_end is None and e.get("event") == "progress":
                st = [v.get("status") for v in e.get("peers", {}).values()]
                if len(st) >= len(regions) and all(s == DONE for s in st):
                    at_end, t_end = network.counters(), time.monotonic()
            if e.get("event") == "report":
                break
        if t_end is None:  # the coordinator saw every peer done between two progress lines
            at_end, t_end = network.counters(), time.monotonic()
    report = json.loads((report_dir / "report.json").read_text())
    checkpoints, note = read_checkpoints(job, report, t_go_wall)
    return GeotrainRun(wall_s=t_end - t_go, report=report, checkpoints=checkpoints, checkpoint_note=note,
                       kernel_bytes=diff(at_end, at_go), kernel_setup_bytes=diff(at_go, before_setup))


def read_checkpoints(job: dict[str, Any], report: dict[str, Any], t_go_wall: float) -> tuple[list[dict[str, Any]], str | None]:
    """Complete checkpoints as ``[{t_s, tokens, params}]``; a note instead when there are none."""
    root = Path(job["checkpoint"]["dir"])
    try:
        from geotrain.peers import checkpoint
    except ImportError:
        return [], "geotrain.peers.checkpoint is missing: only the final global model is evaluated"
    from geotrain.models import GPTConfig

    num_blocks = GPTConfig.preset(job["model"]["preset"]).num_blocks
    plans = report.get("plans") or [{}]
    pipelines = len(plans[-1].get("pipelines") or [])
    tokens_per_step = pipelines * job["pipeline"]["micro_batch_size"] * job["pipeline"]["microbatches"] * \
        GPTConfig.preset(job["model"]["preset"]).seq_len
    out = []
    for d in sorted(root.glob("step-*")):
        manifests = list(d.glob("b*-*.json"))
        if not manifests:
            continue
        step = int(d.name.split("-")[1])
        try:
            state = checkpoint.load(root, step, job_id=report["summary"]["job_id"])
        except Exception as e:  # noqa: BLE001 (a half-written step is skipped, as the resume path does)
            logger.info("checkpoint %s skipped: %s", d, e)
            continue
        covered = {int(n.split(".")[1]) for n in state.params if n.startswith("blocks.")}
        if covered and len(covered) < num_blocks:
            continue
        t = max(m.stat().st_mtime for m in manifests) - t_go_wall
        out.append({"t_s": t, "tokens": step * tokens_per_step, "params": state.params})
    note = None if out else f"no complete checkpoints under {root}: only the final global model is evaluated"
    return out, note
