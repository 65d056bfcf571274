"""The job spec: what to train, where the data comes from, how to pipeline and sync, when to stop.

A job file is TOML (see ``docs/job.md`` and ``examples/jobs/``). Every section
maps onto one frozen dataclass below; :func:`load_job` checks unknown keys,
types and cross-field rules, and each error names the field and the fix::

    [job]        name, seed
    [model]      preset or explicit GPT shape, hf_config / hf_pretrained (local Hugging Face model),
                 or loader = "module:function"; seq_len, dtype, activation_checkpointing
    [data]       source = "stdlib" | "text" | "jsonl" | "parquet" | "hf_disk", path, text_field, tokenizer
    [pipeline]   stages, pipelines ("auto" or a number), micro_batch_size, microbatches, schedule,
                 merge_microbatches
    [optimizer]  inner AdamW: lr, weight_decay, betas, grad_clip; warmup_steps, schedule, decay_steps
    [sync]       every (H), outer_lr, outer_momentum, nesterov, codec, fragments, overlap, mixing,
                 error_feedback, aggregation
    [codecs]     activation, activation_grad
    [objective]  kind = "throughput" | "cost", max_usd_per_hour, min_tokens_per_s
    [stop]       steps, tokens, wall_s, usd (first reached wins)
    [checkpoint] dir, every_rounds, keep, allow_seed_restart
    [swarm]      min_peers, wait_peers_s, hop_timeout_s, round_timeout_s, heartbeat_s, link_degraded_ratio,
                 link_replan_s
    [report]     dir, eval_every, eval_batches, export
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from geotrain.errors import ConfigError
from geotrain.files import read_structured

#: inner steps a job runs when its [stop] section sets no condition
DEFAULT_STEPS = 100


@dataclass(frozen=True, kw_only=True)
class JobSection:
    name: str = "job"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ConfigError(f"job.name must be letters, digits, '-', '_' or '.'; got {self.name!r}")


@dataclass(frozen=True, kw_only=True)
class ModelSection:
    """What to train: the reference GPT (``preset`` + overrides), a local Hugging Face causal LM
    (``hf_config`` or ``hf_pretrained``) or a user model (``loader``).

    ``vocab_size``, ``hf_config_json`` and ``weights_digest`` are filled when the job is resolved
    (``geotrain run`` / ``geotrain check``): the tokenizer's vocabulary, the HF config itself (so a peer
    needs no copy of it) and the SHA-256 of ``hf_pretrained``'s weights, which every peer checks.
    """

    preset: str = "tiny"
    n_layer: int | None = None
    n_head: int | None = None
    d_model: int | None = None
    seq_len: int | None = None
    tie_embeddings: bool | None = None
    loader: str | None = None  # "module:function" returning a geotrain BlockModel
    hf_config: str | None = None  # a transformers config.json, or a directory holding one
    hf_pretrained: str | None = None  # a save_pretrained directory: config.json + *.safetensors
    dtype: Literal["fp32", "bf16"] = "fp32"  # compute dtype (bf16: autocast; master weights stay fp32)
    activation_checkpointing: bool = False
    vocab_size: int | None = None
    hf_config_json: str | None = None
    weights_digest: str | None = None

    def __post_init__(self) -> None:
        errors = []
        if self.loader is not None and ":" not in self.loader:
            errors.append(f"model.loader must look like 'package.module:function'; got {self.loader!r}")
        kinds = [k for k in ("loader", "hf_config", "hf_pretrained") if getattr(self, k) is not None]
        if len(kinds) > 1:
            errors.append(f"model: give one of loader, hf_config, hf_pretrained; got {', '.join(kinds)}")
        if self.is_hf:
            gpt_only = [k for k in ("n_layer", "n_head", "d_model", "tie_embeddings") if getattr(self, k) is not None]
            if gpt_only:
                errors.append(f"model.{gpt_only[0]} shapes the reference GPT only; a Hugging Face model takes its "
                              "shape from its config.json (remove the key or edit the config)")
            if self.seq_len is None:
                errors.append("model.seq_len (the training context, in tokens) is required with "
                              f"model.{kinds[0]}")
        if self.vocab_size is not None and self.vocab_size < 2:
            errors.append(f"model.vocab_size must be >= 2; got {self.vocab_size}")
        if self.seq_len is not None and self.seq_len < 1:
            errors.append(f"model.seq_len must be >= 1; got {self.seq_len}")
        if errors:
            raise ConfigError.many(errors)

    @property
    def is_hf(self) -> bool:
        return self.hf_config is not None or self.hf_pretrained is not None

    def block_model(self, seed: int = 0, *, device: str = "cpu") -> Any:
        """The model as a geotrain BlockModel: the reference GPT, a Hugging Face model, or the user's ``loader``.

        ``device="meta"`` builds a Hugging Face model without weights (for profiles of big models).
        """
        from geotrain.models import GPTModel, resolve_model

        if self.loader is not None:
            return resolve_model(self.loader, seed=seed)
        if self.is_hf:
            from geotrain.models.hf_job import hf_block_model

            return hf_block_model(self, seed=seed, device=device)
        return GPTModel(self.gpt_config())

    @property
    def context(self) -> int:
        """Tokens per sample: ``seq_len`` (given, or the preset GPT's)."""
        if (self.is_hf or self.loader is not None) and self.seq_len is not None:
            return int(self.seq_len)
        return int(self.gpt_config().seq_len)

    def gpt_config(self) -> Any:
        from geotrain.models import GPTConfig

        overrides = {
            k: getattr(self, k)
            for k in ("n_layer", "n_head", "d_model", "seq_len", "tie_embeddings", "vocab_size")
            if getattr(self, k) is not None
        }
        return GPTConfig.preset(self.preset, **overrides)


@dataclass(frozen=True, kw_only=True)
class DataSection:
    """Where the text comes from and how it becomes tokens (docs/data.md).

    ``tokenizer_digest`` and ``digest`` (the token cache's SHA-256) are filled when the job is resolved;
    a peer whose tokenizer or tokens differ refuses to train.
    """

    source: Literal["stdlib", "text", "jsonl", "parquet", "hf_disk", "hf"] = "stdlib"
    path: str | None = None
    text_field: str = "text"
    tokenizer: str = "bytes"  # "bytes" | "PATH" (tokenizer.json or a model directory) | "bpe:N"
    on_bad_text: Literal["skip", "error"] = "skip"
    max_bytes: int = 2 << 20
    val_fraction: float = 0.05
    tokenizer_digest: str | None = None
    digest: str | None = None

    def data_config(self) -> Any:
        from geotrain.data import DataConfig

        return DataConfig(source=self.source, path=self.path, max_bytes=self.max_bytes, val_fraction=self.val_fraction,
                          **self._text_options())

    def _text_options(self) -> dict[str, Any]:
        """The keys only the tokenizer-aware data layer knows (left out at their defaults, for older layers)."""
        out: dict[str, Any] = {}
        if self.text_field != "text":
            out["text_field"] = self.text_field
        if self.tokenizer != "bytes":
            out["tokenizer"] = self.tokenizer
        if self.on_bad_text != "skip":
            out["on_bad_text"] = self.on_bad_text
        return out


@dataclass(frozen=True, kw_only=True)
class PipelineSection:
    """How each pipeline runs an inner step: ``microbatches`` of ``micro_batch_size`` sequences.

    ``merge_microbatches``: where the plan gives a pipeline one stage (a peer holds the whole model), run
    the step's microbatches as one forward/backward of ``micro_batch_size x microbatches`` sequences
    instead of accumulating them one by one: the same gradient, fewer and larger kernels, but the
    activation memory of the whole batch at once. Off by default, as ``micro_batch_size`` may have been
    chosen to fit memory; with two or more stages microbatches are what keeps the stages busy, and it
    changes nothing.
    """

    stages: int | Literal["auto"] = "auto"
    pipelines: int | Literal["auto"] = "auto"
    micro_batch_size: int = 8
    microbatches: int = 4
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    merge_microbatches: bool = False

    def __post_init__(self) -> None:
        for name in ("stages", "pipelines"):
            v = getattr(self, name)
            if v != "auto" and (not isinstance(v, int) or v < 1):
                raise ConfigError(f"pipeline.{name} must be 'auto' or an integer >= 1; got {v!r}")
        if self.micro_batch_size < 1 or self.microbatches < 1:
            raise ConfigError("pipeline.micro_batch_size and pipeline.microbatches must be >= 1")
        if not isinstance(self.merge_microbatches, bool):
            raise ConfigError(f"pipeline.merge_microbatches must be true or false; got {self.merge_microbatches!r}")


@dataclass(frozen=True, kw_only=True)
class OptimizerSection:
    """The inner optimizer (AdamW) and its learning-rate schedule over the job's inner steps.

    ``schedule``: "constant", or "cosine"/"linear" decay from ``lr`` to ``lr * min_lr_ratio`` at
    ``decay_steps`` (default: ``stop.steps``), after ``warmup_steps`` of linear warm-up from 0.
    """

    lr: float = 3e-3
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    decay_steps: int | None = None
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        errors = []
        if self.lr <= 0:
            errors.append(f"optimizer.lr must be > 0; got {self.lr}")
        if self.weight_decay < 0:
            errors.append(f"optimizer.weight_decay must be >= 0; got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                errors.append(f"optimizer.{name} must be in [0, 1); got {getattr(self, name)}")
        if self.warmup_steps < 0:
            errors.append(f"optimizer.warmup_steps must be >= 0; got {self.warmup_steps}")
        if self.decay_steps is not None and self.decay_steps < 1:
            errors.append(f"optimizer.decay_steps must be >= 1; got {self.decay_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            errors.append(f"optimizer.min_lr_ratio must be in [0, 1]; got {self.min_lr_ratio}")
        if errors:
            raise ConfigError.many(errors)


#: Inner steps per round (H) when nothing says otherwise: a job file's ``sync.every``,
#: :class:`geotrain.sync.DiLoCoConfig` and a what-if scenario's ``sync_every`` all default to it.
DEFAULT_SYNC_EVERY = 10


def check_mixing(mixing: float) -> None:
    """``sync.mixing`` (alpha) must be in [0, 1), in the job file and in every sync built from it: 0 takes
    the global weights, 1 would keep the local ones and never take the round's result."""
    if isinstance(mixing, bool) or not isinstance(mixing, (int, float)) or not 0.0 <= mixing < 1.0:
        raise ConfigError(
            f"sync.mixing must be in [0, 1) (0 = take the global weights; 1 would never take them); got {mixing!r}"
        )


@dataclass(frozen=True, kw_only=True)
class SyncSection:
    every: int = DEFAULT_SYNC_EVERY
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
        check_mixing(self.mixing)
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
    """When the job ends: the first condition reached wins. Only conditions the user set apply; with
    none set at all the job stops after :data:`DEFAULT_STEPS` inner steps."""

    steps: int | None = None
    tokens: int | None = None
    wall_s: float | None = None
    usd: float | None = None

    def __post_init__(self) -> None:
        if all(v is None for v in (self.steps, self.tokens, self.wall_s, self.usd)):
            object.__setattr__(self, "steps", DEFAULT_STEPS)
        for name in ("steps", "tokens", "wall_s", "usd"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ConfigError(f"stop.{name} must be > 0; got {v}")


def _check_remote_url(url: str) -> None:
    """ConfigError unless ``url`` is ``PROTOCOL://PATH`` with a protocol fsspec knows (checked by name: an
    ``s3://`` URL passes where s3fs is missing, and fails at the first upload, logged and counted)."""
    m = re.match(r"^([a-z][a-z0-9+.-]*)://(.*)$", url)
    if m is None or not m.group(2).strip("/"):
        raise ConfigError(f"checkpoint.remote must be an fsspec URL like file:///srv/ckpt or s3://bucket/prefix; "
                          f"got {url!r}")
    import fsspec

    known = fsspec.available_protocols()
    if m.group(1) not in known:
        raise ConfigError(f"checkpoint.remote {url!r}: unknown protocol {m.group(1)!r} (fsspec knows e.g. "
                          f"{', '.join(p for p in ('file', 's3', 'gs', 'az', 'hdfs', 'sftp') if p in known)})")
    if m.group(1) == "file" and not m.group(2).startswith("/"):
        raise ConfigError(f"checkpoint.remote {url!r}: a file:// URL needs an absolute path (file:///abs/dir)")


@dataclass(frozen=True, kw_only=True)
class CheckpointSection:
    """``dir``: a shared directory stage groups also write to (optional); ``every_rounds``: rounds between
    checkpoints (each peer writes its own blocks into its ``--state-dir``); ``keep``: checkpoint rounds a peer
    keeps; ``allow_seed_restart``: past step 0, restart blocks no live peer holds from the seed instead of
    stopping the job; ``remote``: an fsspec URL (``file:///dir``, ``s3://bucket/prefix``, ...) each stage
    group's leader also uploads its shards to, used on resume for blocks no live peer holds
    (:mod:`geotrain.peers.remote`)."""

    dir: str | None = None
    every_rounds: int = 1
    keep: int = 2
    allow_seed_restart: bool = False
    remote: str | None = None

    def __post_init__(self) -> None:
        if self.every_rounds < 0 or self.keep < 1:
            raise ConfigError(f"checkpoint.every_rounds must be >= 0 and checkpoint.keep >= 1; "
                              f"got {self.every_rounds} and {self.keep}")
        if self.remote is not None:
            _check_remote_url(self.remote)


@dataclass(frozen=True, kw_only=True)
class SwarmSection:
    min_peers: int = 2
    wait_peers_s: float = 120.0
    hop_timeout_s: float = 30.0
    round_timeout_s: float = 60.0
    heartbeat_s: float = 10.0
    # a pipeline hop whose real traffic measures its link below this share of what the plan assumed, for
    # link_replan_s, gets a new plan (reason "link") that prices the link at its measured figure. Off (0) by
    # default: on a loaded machine scheduling gaps have passed for a slow fast link (a false replan)
    link_degraded_ratio: float = 0.0
    link_replan_s: float = 30.0

    def __post_init__(self) -> None:
        if self.min_peers < 1:
            raise ConfigError(f"swarm.min_peers must be >= 1; got {self.min_peers}")
        if not 0.0 <= self.link_degraded_ratio < 1.0:
            raise ConfigError(f"swarm.link_degraded_ratio must be in [0, 1); got {self.link_degraded_ratio}")
        if not self.link_replan_s > 0:
            raise ConfigError(f"swarm.link_replan_s must be > 0; got {self.link_replan_s}")


@dataclass(frozen=True, kw_only=True)
class ReportSection:
    dir: str = "runs"
    eval_every: int = 0  # > 0: validation loss of the global model every this many steps (0 = start and end only)
    eval_batches: int = 4
    export: bool = False  # write the final model as a Hugging Face directory into <report dir>/export

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

        errors: list[str] = []
        for where, spec in (
            ("sync.codec", self.sync.codec),
            ("sync.intra_codec", self.sync.intra_codec),
            ("codecs.activation", self.codecs.activation),
            ("codecs.activation_grad", self.codecs.activation_grad),
        ):
            try:
                get_codec(spec)
            except ValueError as e:
                errors.append(f"{where}: {e}")
        try:
            self.data.data_config()  # validates source/path/sizes
        except ConfigError as e:
            errors.extend(e.errors)
        if self.model.loader is None and not self.model.is_hf:
            try:
                cfg = self.model.gpt_config()
            except ConfigError as e:
                errors.extend(e.errors)
            else:
                if isinstance(self.pipeline.stages, int) and self.pipeline.stages > cfg.num_blocks:
                    errors.append(
                        f"pipeline.stages = {self.pipeline.stages} but the model has only {cfg.num_blocks} blocks "
                        f"(embedding + {cfg.n_layer} layers + head); use at most {cfg.num_blocks} stages"
                    )
        if self.optimizer.schedule != "constant" and self.optimizer.decay_steps is None and self.stop.steps is None:
            errors.append(f"optimizer.schedule = {self.optimizer.schedule!r} decays over optimizer.decay_steps; "
                          "set it (or stop.steps), since a job stopped by tokens, time or money has no step count")
        if errors:
            raise ConfigError.many(errors)

    @property
    def decay_steps(self) -> int | None:
        """Inner steps over which the learning rate decays (``optimizer.decay_steps``, else ``stop.steps``)."""
        return self.optimizer.decay_steps if self.optimizer.decay_steps is not None else self.stop.steps

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
    """Build one section; every problem of it (unknown keys, wrong types, its own checks) in one ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError(f"[{where}] must be a table")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    errors = [
        f"unknown key {where}.{k}; known keys of [{where}]: {', '.join(sorted(names))}"
        for k in sorted(set(data) - names)
    ]
    kwargs = {}
    for k, v in data.items():
        if k not in names:
            continue
        try:
            kwargs[k] = _check(v, hints[k], f"{where}.{k}")
        except ConfigError as e:
            errors.extend(e.errors)
    if errors:
        raise ConfigError.many(errors)
    return cls(**kwargs)


def job_from_dict(data: dict[str, Any]) -> JobSpec:
    """Validate a parsed job (TOML or the DHT's JSON copy) into a :class:`JobSpec`.

    Every problem of the file is reported at once (``ConfigError.errors``), not one per try.
    """
    if not isinstance(data, dict):
        raise ConfigError("a job must be a table of sections")
    hints = typing.get_type_hints(JobSpec)
    errors = [f"unknown section [{name}]; known sections: {', '.join(hints)}" for name in sorted(set(data) - set(hints))]
    sections: dict[str, Any] = {}
    for name, value in data.items():
        if name not in hints:
            continue
        try:
            sections[name] = _section(hints[name], value, name)
        except ConfigError as e:
            errors.extend(e.errors)
    if errors:
        raise ConfigError.many(errors)
    return JobSpec(**sections)


#: job-file keys that name files: a relative path is taken relative to the job file's directory
PATH_KEYS = (("model", "hf_config"), ("model", "hf_pretrained"), ("data", "path"), ("data", "tokenizer"))


def _anchor_paths(data: dict[str, Any], base: Path) -> None:
    for section, key in PATH_KEYS:
        table = data.get(section)
        if not isinstance(table, dict):
            continue
        value = table.get(key)
        if not isinstance(value, str) or value == "bytes" or value.startswith("bpe:") or Path(value).is_absolute():
            continue
        if section == "data" and key == "path" and table.get("source", "stdlib") == "hf" and not (base / value).exists():
            continue  # a datasets name, not a path
        table[key] = str((base / value).resolve())


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a TOML job file. Relative paths in it (``PATH_KEYS``) are relative to its directory."""
    p = Path(path)
    data = read_structured(p, what="job file", fmt="toml")
    if isinstance(data, dict):
        _anchor_paths(data, p.resolve().parent)
    try:
        return job_from_dict(data)
    except ConfigError as e:
        raise ConfigError.many([f"{p}: {m}" for m in e.errors]) from None
