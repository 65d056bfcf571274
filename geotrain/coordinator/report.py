"""The end-of-job report: ``report.json`` and PNG plots.

``report.json`` keys (documented in docs/job.md, checked by the end-to-end test)::

    job            the job spec as run
    started_at, finished_at, wall_s
    peers          [{peer_id, region, device, tflops, usd_per_hour}]
    plans          [{version, t_s, pipelines, spares, predicted}]
    loss           [{t_s, step, tokens, loss, peer}]        training loss seen on last stages
    validation     [{t_s, step, tokens, loss, source}]      held-out loss of the global model
    throughput     {tokens, tokens_per_s, samples: [{t_s, tokens_per_s}]}
    utilisation    {peer: fraction of wall time in forward/backward}
    peer_stats     {peer: {steps, compute_s, wall_s, sync_wait_s, round_s, rounds, checkpoint_s, cpu_s, in_plan_s, ...}}
                   where each peer's time went (its last progress record; see StageWorker.stats)
    bytes          {by_region_pair: {"a->b": n}, cross_region, total}
    usd            {compute, egress, total, per_peer}
    events         [{t_s, kind, ...}]   kinds: start, join, death, stall, replan, round, stop, checkpoint, error
    checkpoints    {dir, last_round}
    summary        the headline figures shown at the end of `geotrain run` / `geotrain demo`
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

REPORT_KEYS = (
    "job",
    "started_at",
    "finished_at",
    "wall_s",
    "peers",
    "plans",
    "loss",
    "validation",
    "throughput",
    "utilisation",
    "peer_stats",
    "bytes",
    "usd",
    "events",
    "checkpoints",
    "summary",
)


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, allow_nan=False, default=_jsonable)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")


def _clean(x: Any) -> Any:
    """Replace non-finite floats (JSON has none) by None, recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_report(out_dir: Path, report: dict[str, Any]) -> Path:
    """Write ``report.json`` and the plots into ``out_dir``; returns the JSON path."""
    missing = [k for k in REPORT_KEYS if k not in report]
    assert not missing, f"report lacks {missing}"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    write_json_atomic(path, _clean(report))
    try:
        plot_report(out_dir, report)
    except Exception:  # plots are a convenience; the JSON is the record
        logger.exception("could not draw the report's plots")
    return path


def plot_report(out_dir: Path, report: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        p = out_dir / name
        fig.tight_layout()
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)

    loss = [r for r in report["loss"] if r.get("loss") is not None]
    val = [r for r in report["validation"] if r.get("loss") is not None]
    for x_key, x_label, name in (("tokens", "tokens", "loss_vs_tokens.png"), ("t_s", "wall time (s)", "loss_vs_time.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        if loss:
            ax.plot([r[x_key] for r in loss], [r["loss"] for r in loss], ".", alpha=0.5, label="train (last stages)")
        if val:
            ax.plot([r[x_key] for r in val], [r["loss"] for r in val], "o-", label="validation (global model)")
        ax.set_xlabel(x_label)
        ax.set_ylabel("loss (nats/byte)")
        ax.legend()
        ax.grid(alpha=0.3)
        save(fig, name)

    samples = report["throughput"].get("samples", [])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([s["t_s"] for s in samples], [s["tokens_per_s"] for s in samples], "-")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("tokens/s")
    ax.grid(alpha=0.3)
    save(fig, "throughput.png")

    pairs: dict[str, float] = report["bytes"].get("by_region_pair", {})
    regions = sorted({r for key in pairs for r in key.split("->")})
    fig, ax = plt.subplots(figsize=(5, 4))
    if regions:
        idx = {r: i for i, r in enumerate(regions)}
        grid = [[0.0] * len(regions) for _ in regions]
        for key, n in pairs.items():
            a, b = key.split("->")
            grid[idx[a]][idx[b]] = n / 1e6
        im = ax.imshow(grid, cmap="viridis")
        ax.set_xticks(range(len(regions)), regions, rotation=30)
        ax.set_yticks(range(len(regions)), regions)
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.1f}", ha="center", va="center", color="w", fontsize=8)
        fig.colorbar(im, label="MB sent (row -> column)")
    ax.set_title("traffic by region pair")
    save(fig, "traffic.png")

    usd = report["usd"]
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.bar(["compute", "egress"], [usd.get("compute", 0.0), usd.get("egress", 0.0)], color=["tab:blue", "tab:orange"])
    ax.set_ylabel("USD")
    ax.set_title(f"cost: ${usd.get('total', 0.0):.4f}")
    save(fig, "cost.png")
    return paths
