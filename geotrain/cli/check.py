"""``geotrain check JOB.toml [--scenario FILE]``: check a whole job before it runs.

Validates every key of the job file and reports every problem at once; builds
the model on the meta device (imports a ``model.loader``, reads a Hugging Face
config), opens the data and its text field, builds or loads the tokenizer and
the token cache, and checks the packages the peers will need. With
``--scenario`` it also plans the job on that scenario's swarm. ``geotrain run``
makes the same checks before it publishes anything. Exit status 0 when the
job is ready, 2 with the list of problems otherwise. ``--json`` prints one JSON
object instead of the table.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="check a job file whole (model, data, tokenizer) before running it",
                       description=__doc__)
    p.add_argument("job", help="job file (TOML); see docs/job.md")
    p.add_argument("--scenario", default=None, metavar="FILE", help="also plan the job on this scenario's swarm")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="read the job's data under DIR, as `geotrain peer --data-dir` does")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    import sys

    from geotrain.config import load_job
    from geotrain.coordinator.prepare import prepare_job
    from geotrain.errors import ConfigError
    from geotrain.peers.localise import localise_job

    try:
        # --data-dir: check the job as a peer holding its data there would see it
        prepared = prepare_job(localise_job(load_job(args.job), data_dir=args.data_dir))
    except ConfigError as e:
        if args.json:
            print(json.dumps({"ok": False, "errors": list(e.errors)}))
        else:
            print(f"geotrain check: {args.job}: {len(e.errors)} problem(s):", file=sys.stderr)
            for msg in e.errors:
                print(f"  - {msg}", file=sys.stderr)
        return 2
    out: dict[str, Any] = {"ok": True, **prepared.summary()}
    if args.scenario:
        out["plan"] = _plan(prepared.job, args.scenario)
    if args.json:
        print(json.dumps(out, default=str))
    else:
        _print(args.job, out)
    return 0


def _plan(job: Any, scenario_path: str) -> dict[str, Any]:
    """The job planned on a scenario's swarm: the scenario's regions, peers and links, this job's model,
    dtype, pipeline and sync settings (as ``geotrain run`` would plan it on that swarm)."""
    from geotrain.coordinator.planning import job_scenario
    from geotrain.errors import ScenarioError
    from geotrain.files import read_structured
    from geotrain.planner import Scenario
    from geotrain.planner import plan as run_planner

    raw = read_structured(scenario_path, what="scenario", fmt="json", error=ScenarioError)
    if not isinstance(raw, dict):
        raise ScenarioError(f"{scenario_path}: a scenario is a JSON object")
    raw = {**raw, **job_scenario(job)}
    try:
        sc = Scenario.from_dict(raw)
    except ScenarioError as e:
        raise ScenarioError(f"{scenario_path}: {e}") from None
    return dict(run_planner(sc).to_json())


def _print(path: str, out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{path}: ready to run")
    t.add_column("what")
    t.add_column("figure")
    for section in ("model", "tokenizer", "data"):
        for k, v in out[section].items():
            if v is None:
                continue
            shown = f"{v[:16]}..." if isinstance(v, str) and len(v) == 64 else f"{v:,}" if isinstance(v, int) else v
            t.add_row(f"{section}.{k}", str(shown))
    Console().print(t)
    if "plan" in out:
        print(json.dumps(out["plan"], default=str, indent=2))
