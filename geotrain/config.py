"""The job spec: what to train, where the data comes from, how to pipeline and sync, when to stop.

A job file is TOML (see ``docs/job.md`` and ``examples/jobs/``). Every section
maps onto one frozen dataclass below; :func:`load_job` checks unknown keys,
types and cross-field rules, and each error names the field and the fix::

    [job]        name, seed
    [model]      preset or explicit GPT shape, or loader = "module:function"
    [data]       source = "stdlib" | "text" | "hf", path, max_bytes
    [pipeline]   stages, pipelines ("auto" or a number), micro_batch_size, microbatches, schedule
    [optimizer]  inner AdamW: lr, weight_decay, betas, grad_clip
    [sync]       every (H), outer_lr, outer_momentum, nesterov, codec, fragments, overlap, mixing,
                 error_feedback, aggregation
    [codecs]     activation, activation_grad
    [objective]  kind = "throughput" | "cost", max_usd_per_hour, min_tokens_per_s
    [stop]       steps, tokens, wall_s, usd (first reached wins)
    [checkpoint] dir, every_rounds
    [swarm]      min_peers, wait_peers_s, hop_timeout_s, round_timeout_s, heartbeat_s
    [report]     dir, eval_every, eval_batches
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from geotrain.errors import ConfigError
from geotrain.files import read_structured


@dataclass(frozen=True, kw_only=True)
class JobSection:
    name: str = "job"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ConfigError(f"job.name must be letters, digits, '-', '_' or '.'; got {self.name!r}")


@dataclass(frozen=True, kw_only=True)
class ModelSection:
    preset: str = "tiny"
    n_layer: int | None = None
    n_head: int | None = None
    d_model: int | None = None
    seq_len: int | None = None
    tie_embeddings: bool | None = None
    loader: str | None = None  # "module:function" returning a geotrain BlockModel

    def __post_init__(self) -> None:
        if self.loader is not None and ":" not in self.loader:
            raise ConfigError(f"model.loader must look like 'package.module:function'; got {self.loader!r}")

    def block_model(self, seed: int = 0) -> Any:
        """The model as a geotrain BlockModel: the reference GPT, or the user's ``loader``."""
        from geotrain.models import GPTModel, resolve_model

        if self.loader is not None:
            return resolve_model(self.loader, seed=seed)
        return GPTModel(self.gpt_config())

    @property
    def context(self) -> int:
        """Tokens per sample: ``seq_len`` of the configured (or preset) GPT."""
        return int(self.gpt_config().seq_len)

    def gpt_config(self) -> Any:
        from geotrain.models import GPTConfig

        overrides = {
            k: getattr(self, k)
            for k in ("n_layer", "n_head", "d_model", "seq_len", "tie_embeddings")
            if getattr(self, k) is not None
        }
        return GPTConfig.preset(self.preset, **overrides)


@dataclass(frozen=True, kw_only=True)
class DataSection:
    source: Literal["stdlib", "text", "hf"] = "stdlib"
    path: str | None = None
    max_bytes: int = 2 << 20
    val_fraction: float = 0.05

    def data_config(self) -> Any:
        from geotrain.data import DataConfig

        return DataConfig(source=self.source, path=self.path, max_bytes=self.max_bytes, val_fraction=self.val_fraction)


@dataclass(frozen=True, kw_only=True)
class PipelineSection:
    stages: int | Literal["auto"] = "auto"
    pipelines: int | Literal["auto"] = "auto"
    micro_batch_size: int = 8
    microbatches: int = 4
    schedule: Literal["1f1b", "gpipe"] = "1f1b"

    def __post_init__(self) -> None:
        for name in ("stages", "pipelines"):
            v = getattr(self, name)
            if v != "auto" and (not isinstance(v, int) or v < 1):
                raise ConfigError(f"pipeline.{name} must be 'auto' or an integer >= 1; got {v!r}")
        if self.micro_batch_size < 1 or self.microbatches < 1:
            raise ConfigError("pipeline.micro_batch_size and pipeline.microbatches must be >= 1")


@dataclass(frozen=True, kw_only=True)
class OptimizerSection:
    lr: float = 3e-3
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optimizer.lr must be > 0; got {self.lr}")


@dataclass(frozen=True, kw_only=True)
class SyncSection:
    every: int = 10
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    codec: str = "int8"
    intra_codec: str = "none"
    fragments: int = 1
    overlap: int = 0  # tau: inner steps a fragment's result is applied after its sync starts
    mixing: float = 0.5  # alpha
    error_feedback: bool = True
    aggregation: Literal["mean", "trimmed_mean", "centered_clip"] = "mean"

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ConfigError(f"sync.every must be > 0; got {self.every}")
        if self.fragments < 1 or self.fragments > self.every:
            raise ConfigError(f"sync.fragments must be in 1..sync.every ({self.every}); got {self.fragments}")
        if self.overlap < 0 or self.overlap >= self.every:
            raise ConfigError(f"sync.overlap must be in 0..sync.every-1; got {self.overlap}")
        if not 0.0 <= self.mixing <= 1.0:
            raise ConfigError(f"sync.mixing must be in [0, 1]; got {self.mixing}")
        if self.outer_lr <= 0:
            raise ConfigError(f"sync.outer_lr must be > 0; got {self.outer_lr}")


@dataclass(frozen=True, kw_only=True)
class CodecsSection:
    activation: str = "fp16"
    activation_grad: str = "fp16"


@dataclass(frozen=True, kw_only=True)
class ObjectiveSection:
    kind: Literal["throughput", "cost"] = "throughput"
    max_usd_per_hour: float | None = None
    min_tokens_per_s: float | None = None

    def planner_objective(self) -> Any:
        if self.max_usd_per_hour is not None:
            return {"max_usd_per_hour": self.max_usd_per_hour}
        if self.min_tokens_per_s is not None:
            return {"min_tokens_per_s": self.min_tokens_per_s}
        return self.kind


@dataclass(frozen=True, kw_only=True)
class StopSection:
    steps: int | None = 100
    tokens: int | None = None
    wall_s: float | None = None
    usd: float | None = None

    def __post_init__(self) -> None:
        if all(v is None for v in (self.steps, self.tokens, self.wall_s, self.usd)):
            raise ConfigError("stop needs at least one of steps, tokens, wall_s, usd")


@dataclass(frozen=True, kw_only=True)
class CheckpointSection:
    dir: str | None = None
    every_rounds: int = 1


@dataclass(frozen=True, kw_only=True)
class SwarmSection:
    min_peers: int = 2
    wait_peers_s: float = 120.0
    hop_timeout_s: float = 30.0
    round_timeout_s: float = 60.0
    heartbeat_s: float = 5.0

    def __post_init__(self) -> None:
        if self.min_peers < 1:
            raise ConfigError(f"swarm.min_peers must be >= 1; got {self.min_peers}")


@dataclass(frozen=True, kw_only=True)
class ReportSection:
    dir: str = "runs"
    eval_every: int = 0  # > 0: validation loss of the global model every this many steps (0 = start and end only)
    eval_batches: int = 4

    def __post_init__(self) -> None:
        if self.eval_every < 0 or self.eval_batches < 1:
            raise ConfigError("report.eval_every must be >= 0 and report.eval_batches >= 1")


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A whole job. Build with :func:`load_job` / :func:`job_from_dict`; serialised with :meth:`to_dict`."""

    job: JobSection = field(default_factory=JobSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    pipeline: PipelineSection = field(default_factory=PipelineSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    sync: SyncSection = field(default_factory=SyncSection)
    codecs: CodecsSection = field(default_factory=CodecsSection)
    objective: ObjectiveSection = field(default_factory=ObjectiveSection)
    stop: StopSection = field(default_factory=StopSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    swarm: SwarmSection = field(default_factory=SwarmSection)
    report: ReportSection = field(default_factory=ReportSection)

    def __post_init__(self) -> None:
        from geotrain.compression import get_codec

        for where, spec in (
            ("sync.codec", self.sync.codec),
            ("sync.intra_codec", self.sync.intra_codec),
            ("codecs.activation", self.codecs.activation),
            ("codecs.activation_grad", self.codecs.activation_grad),
        ):
            try:
                get_codec(spec)
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None
        self.data.data_config()  # validates source/path/sizes
        if self.model.loader is None:
            cfg = self.model.gpt_config()
            if isinstance(self.pipeline.stages, int) and self.pipeline.stages > cfg.num_blocks:
                raise ConfigError(
                    f"pipeline.stages = {self.pipeline.stages} but the model has only {cfg.num_blocks} blocks "
                    f"(embedding + {cfg.n_layer} layers + head); use at most {cfg.num_blocks} stages"
                )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check(value: Any, hint: Any, where: str) -> Any:
    """Check ``value`` against a type hint (the subset this module uses); ints widen to floats."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        errors = []
        for arm in typing.get_args(hint):
            try:
                return _check(value, arm, where)
            except ConfigError as e:
                errors.append(str(e))
        allowed = " or ".join(_describe(a) for a in typing.get_args(hint))
        raise ConfigError(f"{where} must be {allowed}; got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(f"{where} must be one of {list(typing.get_args(hint))}; got {value!r}")
        return value
    if hint is type(None):
        if value is not None:
            raise ConfigError(f"{where} must be empty")
        return None
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false; got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer; got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number; got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string; got {value!r}")
        return value
    raise AssertionError(f"unsupported config type {hint!r} at {where}")


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false", type(None): "absent"}.get(
        hint, str(hint)
    )


def _section(cls: type[Any], data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"[{where}] must be a table")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown key {where}.{unknown[0]}; known keys of [{where}]: {', '.join(sorted(names))}")
    kwargs = {k: _check(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    return cls(**kwargs)


def job_from_dict(data: dict[str, Any]) -> JobSpec:
    """Validate a parsed job (TOML or the DHT's JSON copy) into a :class:`JobSpec`."""
    if not isinstance(data, dict):
        raise ConfigError("a job must be a table of sections")
    hints = typing.get_type_hints(JobSpec)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise ConfigError(f"unknown section [{unknown[0]}]; known sections: {', '.join(hints)}")
    return JobSpec(**{name: _section(hints[name], value, name) for name, value in data.items()})


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a TOML job file."""
    p = Path(path)
    data = read_structured(p, what="job file", fmt="toml")
    try:
        return job_from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
