"""What every worker contender shares: its spec, the model, the data, snapshots and the start barrier.

A *worker* is one peer of a baseline contender (one OS process). It reads a
:class:`WorkerSpec` (JSON written by the benchmark), builds the same model
(the job's GPT, seeded like geotrain builds it) and the same data (the job's
dataset, shard ``rank`` of ``world``), prints ``{"event": "ready", ...}``, waits
for ``go`` on stdin (so every contender's clock starts when all its peers are up
and the kernel's byte counters have been read), trains, and prints
``{"event": "done", ...}``.

A *snapshot* is the global model's parameters at one moment, written by rank 0
(by every hivemind.Optimizer peer) to ``out_dir`` (``torch.save`` of a name -> tensor dict, read back with
``weights_only=True``) with a ``{"event": "snapshot", "t_s", "tokens", "path"}``
line; the benchmark evaluates every snapshot after the run, so validation costs
no contender any training time.
"""

from __future__ import annotations

import json
import select
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from geotrain.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """One baseline run, as every one of its workers sees it.

    ``steps``: inner steps per peer (DP, DiLoCo); ``epochs``: hivemind.Optimizer
    epochs (global steps of ``target_batch_size`` samples); ``every``: DiLoCo's H.
    Both are the *budget*; ``max_steps``/``max_epochs`` (0: the budget) are the
    *cap*: a worker trains past the budget up to the cap until the benchmark
    writes ``stop`` on its stdin (the target loss was reached), and prints a
    ``budget`` event when it passes the budget.
    """

    contender: str
    job: dict[str, Any]
    world: int
    steps: int
    out_dir: str
    snapshot_every: int = 10
    timeout_s: float = 600.0
    go_timeout_s: float = 300.0
    every: int = 10
    compression: str = "fp16"
    target_batch_size: int = 0
    epochs: int = 0
    matchmaking_s: float = 2.0
    averaging_timeout_s: float = 30.0
    run_id: str = "e2e"
    regions: dict[str, str] = field(default_factory=dict)  # rank (str) -> region, for self-counted bytes
    max_steps: int = 0
    max_epochs: int = 0

    def __post_init__(self) -> None:
        if self.world < 2:
            raise ConfigError(f"a contender needs world >= 2 peers; got {self.world}")
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1; raise --budget-tokens (got steps={self.steps})")
        if self.snapshot_every < 1 or self.every < 1:
            raise ConfigError("snapshot_every and every must be >= 1")

    def dump(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path: str | Path) -> WorkerSpec:
        return cls(**json.loads(Path(path).read_text()))


def emit(event: dict[str, Any]) -> None:
    """One JSON line on stdout: the worker's only channel to the benchmark."""
    print(json.dumps(event, default=str), flush=True)


def stop_requested() -> bool:
    """True once the benchmark wrote ``stop`` on stdin (never blocks; stdin closed counts as stop)."""
    ready, _, _ = select.select([sys.stdin], [], [], 0)
    if not ready:
        return False
    line = sys.stdin.readline()
    return not line or line.strip() == "stop"


def wait_go(timeout_s: float) -> None:
    """Block until the benchmark writes a line on stdin (the start barrier), at most ``timeout_s``."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
    if not ready or not sys.stdin.readline():
        raise TimeoutError(f"no 'go' from the benchmark within {timeout_s}s")


class Setup:
    """The model, data and inner optimizer of one worker, identical across contenders."""

    def __init__(self, spec: WorkerSpec, rank: int) -> None:
        from geotrain.config import job_from_dict
        from geotrain.data.job import dataset_for
        from geotrain.models import build_stage

        torch.set_num_threads(1)  # one core's worth per peer, as geotrain peers get (--threads 1)
        self.spec, self.rank = spec, rank
        self.job = job_from_dict(spec.job)
        seed = self.job.job.seed
        block_model = self.job.model.block_model(seed)
        self.model = build_stage(block_model, (0, block_model.num_blocks), seed)
        self.dataset = dataset_for(self.job)
        self.batch_size = self.job.pipeline.micro_batch_size * self.job.pipeline.microbatches
        self.seq_len = self.job.model.context
        self.tokens_per_step = self.batch_size * self.seq_len
        self.out = Path(spec.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.perf_counter()
        self.compute_s = 0.0
        self._snapshots = 0

    def optimizer(self, params: Any = None) -> torch.optim.Optimizer:
        """The inner AdamW, fused where torch has the kernel, as geotrain's stages run it."""
        from geotrain.pipeline.optim import inner_adamw

        o = self.job.optimizer
        return inner_adamw(self.model.parameters() if params is None else params,
                           lr=o.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2))

    def batch(self, step: int) -> torch.Tensor:
        """``(B, T + 1)`` tokens of inner step ``step`` from this peer's shard."""
        return self.dataset.get_batch(
            step, batch_size=self.batch_size, seq_len=self.seq_len, seed=self.job.job.seed,
            shard=self.rank, num_shards=self.spec.world,
        )

    def forward_backward(self, step: int) -> float:
        """Forward + backward on this step's batch (gradients accumulate in ``.grad``); returns the loss."""
        b = self.batch(step)
        t = time.perf_counter()
        loss = self.model.loss(self.model(b[:, :-1]), b[:, 1:])
        loss.backward()
        self.compute_s += time.perf_counter() - t
        return float(loss.detach())

    def start_clock(self) -> None:
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def snapshot(self, tokens: int, params: dict[str, torch.Tensor] | None = None) -> None:
        """Write the global model (``params`` by name, default the local model) and announce it."""
        t_s = self.elapsed()
        named = params if params is not None else {n: p.detach() for n, p in self.model.named_parameters()}
        path = self.out / f"snap-r{self.rank}-{self._snapshots:04d}.pt"
        torch.save({n: t.clone() for n, t in named.items()}, path)
        self._snapshots += 1
        emit({"event": "snapshot", "t_s": round(t_s, 4), "tokens": int(tokens), "path": str(path)})

    def budget(self, tokens: int) -> None:
        """Announce that this worker just trained its budget (its wall time so far is the fixed-budget time)."""
        self.budget_s = self.elapsed()
        self.compute_budget_s = self.compute_s
        emit({"event": "budget", "rank": self.rank, "t_s": round(self.budget_s, 4), "tokens": int(tokens)})

    def done(self, **fields: Any) -> None:
        wall = self.elapsed()
        budget_s = getattr(self, "budget_s", None)
        emit({"event": "done", "rank": self.rank, "train_s": round(wall, 4), "compute_s": round(self.compute_s, 4),
              "utilisation": self.compute_s / wall if wall > 0 else 0.0,
              "budget_s": None if budget_s is None else round(budget_s, 4),
              "compute_budget_s": round(getattr(self, "compute_budget_s", self.compute_s), 4), **fields})
