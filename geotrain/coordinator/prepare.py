"""Before a job is published: check all of it and resolve what every peer must agree on.

What is a *resolved* job? The job file's :class:`~geotrain.config.JobSpec` with
the facts a peer cannot be trusted to derive alone filled in: the tokenizer's
vocabulary (``model.vocab_size``: the model's vocabulary follows the
tokenizer), the Hugging Face config itself (``model.hf_config_json``, so a peer
needs no copy), the weights' SHA-256 (``model.weights_digest``), and the
digests of the tokenizer and of the token cache (``data.tokenizer_digest``,
``data.digest``). Peers compare their own tokenizer, tokens and weights with
these and refuse to train on a mismatch.

:func:`prepare_job` is what ``geotrain check`` runs and what ``geotrain run``
runs before it publishes anything. It reports every problem at once (one
:class:`~geotrain.errors.ConfigError` whose ``errors`` lists them), not one per try.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geotrain.config import JobSpec
from geotrain.data.job import check_peer_data
from geotrain.errors import ConfigError, GeotrainError

__all__ = ["PreparedJob", "prepare_job", "check_peer_data"]

logger = logging.getLogger(__name__)

# optional packages each data source needs on the peers that read data (first and last stages)
_SOURCE_NEEDS = {"parquet": ("pyarrow",), "hf_disk": ("datasets",), "hf": ("datasets",), "jsonl": ()}


@dataclass(frozen=True, kw_only=True)
class PreparedJob:
    """A resolved job (see the module docstring), its dataset and its model's shape."""

    job: JobSpec
    dataset: Any
    num_blocks: int
    num_parameters: int

    def summary(self) -> dict[str, Any]:
        """What ``geotrain check`` prints: the model, the tokenizer and the data, as figures."""
        ds, m = self.dataset, self.job.model
        raw = getattr(ds, "stats", None)
        stats = dataclasses.asdict(raw) if dataclasses.is_dataclass(raw) and not isinstance(raw, type) else {}
        kind = ("hf_pretrained" if m.hf_pretrained else "hf_config" if m.hf_config else
                "loader" if m.loader else f"gpt:{m.preset}")
        model_type = json.loads(m.hf_config_json).get("model_type") if m.hf_config_json else None
        return {
            "model": {"kind": kind, "model_type": model_type, "blocks": self.num_blocks,
                      "parameters": self.num_parameters, "vocab_size": m.vocab_size or 256,
                      "seq_len": m.context, "dtype": m.dtype},
            "tokenizer": {"spec": self.job.data.tokenizer, "digest": self.job.data.tokenizer_digest},
            "data": {"source": self.job.data.source, "path": self.job.data.path, "digest": self.job.data.digest,
                     "train_tokens": int(ds.train.numel()), "val_tokens": int(ds.val.numel()), **stats},
        }


def _read_model_config(job: JobSpec, errors: list[str]) -> str | None:
    from geotrain.models.hf_job import read_hf_config

    m = job.model
    if not m.is_hf:
        return None
    where = m.hf_config if m.hf_config is not None else m.hf_pretrained
    try:
        return json.dumps(read_hf_config(str(where)), sort_keys=True)
    except ConfigError as e:
        errors.append(f"model.{'hf_config' if m.hf_config else 'hf_pretrained'}: {e}")
        return None


def prepare_job(job: JobSpec, *, data_dir: str | Path | None = None) -> PreparedJob:
    """Check ``job`` whole and resolve it (see the module docstring); raises one ConfigError listing everything."""
    from geotrain.data import build_dataset

    errors: list[str] = []
    for pkg in _SOURCE_NEEDS.get(job.data.source, ()):
        if importlib.util.find_spec(pkg) is None:
            errors.append(f"data.source = {job.data.source!r} needs the {pkg!r} package on every peer that reads "
                          f"data; pip install {pkg}")
    m = job.model
    if m.loader is not None:
        module = m.loader.split(":")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            errors.append(f"model.loader: cannot import module {module!r}; is it installed or on PYTHONPATH?")
    config_json = _read_model_config(job, errors)
    weights = None
    if m.hf_pretrained is not None and config_json is not None:
        from geotrain.models.hf import weights_digest

        if not sorted(Path(m.hf_pretrained).glob("*.safetensors")):
            errors.append(f"model.hf_pretrained {m.hf_pretrained!r} holds no *.safetensors weights "
                          "(save the model with save_pretrained(..., safe_serialization=True))")
        else:
            weights = weights_digest(m.hf_pretrained)

    dataset = None
    try:
        dataset = (build_dataset(job.data.data_config(), data_dir=str(data_dir)) if data_dir is not None
                   else build_dataset(job.data.data_config()))
    except GeotrainError as e:
        errors.extend(f"data: {x}" for x in getattr(e, "errors", (str(e),)))
    except OSError as e:
        errors.append(f"data: {e}")
    if errors:
        raise ConfigError.many(errors)
    assert dataset is not None
    vocab = int(getattr(dataset, "vocab_size", 256))
    tok = getattr(dataset, "tokenizer", None)
    model_fields: dict[str, Any] = {"hf_config_json": config_json, "weights_digest": weights}
    if vocab != 256 or m.is_hf or m.vocab_size is not None:
        model_fields["vocab_size"] = vocab
    resolved = dataclasses.replace(
        job,
        model=dataclasses.replace(m, **model_fields),
        data=dataclasses.replace(job.data, tokenizer_digest=getattr(tok, "digest", None),
                                 digest=getattr(dataset, "digest", None)),
    )
    num_blocks, num_params = _check_model(resolved, errors)
    _check_batches(resolved, dataset, errors)
    if errors:
        raise ConfigError.many(errors)
    return PreparedJob(job=resolved, dataset=dataset, num_blocks=num_blocks, num_parameters=num_params)


def _check_model(job: JobSpec, errors: list[str]) -> tuple[int, int]:
    """Build the model on the meta device (no weights): block count, stages, context, vocabulary."""
    m = job.model
    try:
        model = m.block_model(job.job.seed, device="meta")
    except GeotrainError as e:
        errors.extend(f"model: {x}" for x in getattr(e, "errors", (str(e),)))
        return 0, 0
    num_blocks = int(model.num_blocks)
    stages = job.pipeline.stages
    if isinstance(stages, int) and stages > num_blocks:
        errors.append(f"pipeline.stages = {stages} but the model has only {num_blocks} blocks; "
                      f"use at most {num_blocks} stages")
    if m.is_hf:
        if m.seq_len is not None and m.seq_len > model.max_positions:
            errors.append(f"model.seq_len = {m.seq_len} exceeds the model's {model.max_positions} positions")
        if m.hf_pretrained is not None and m.vocab_size is not None and m.vocab_size > model.vocab_size:
            errors.append(f"the tokenizer ({job.data.tokenizer!r}) has {m.vocab_size} tokens but model.hf_pretrained's "
                          f"embedding has {model.vocab_size}; use the tokenizer the model was trained with")
    try:
        if m.is_hf or m.loader is not None:
            blocks = [model.build_block(i, job.job.seed) for i in range(num_blocks)]  # alive: ids stay unique
            params = sum(p.numel() for b in blocks for p in b.parameters())
            for g in model.tied_groups:  # each standalone block holds its own copy of a tied weight
                for b, name in g.members[1:]:
                    copy = dict(blocks[b].named_parameters()).get(name)
                    params -= copy.numel() if copy is not None else 0
        else:
            params = int(m.gpt_config().num_parameters())
    except GeotrainError as e:
        errors.append(f"model: {e}")
        params = 0
    return num_blocks, params


def _check_batches(job: JobSpec, dataset: Any, errors: list[str]) -> None:
    """The data can make one batch per pipeline and the validation batches the report asks for."""
    T = job.model.context
    pipes = job.pipeline.pipelines if isinstance(job.pipeline.pipelines, int) else 1
    batch = job.pipeline.micro_batch_size * job.pipeline.microbatches
    try:
        dataset.get_batch(0, batch_size=batch, seq_len=T, seed=job.job.seed, shard=0, num_shards=pipes)
    except GeotrainError as e:
        errors.append(f"data: {e}")
    try:
        dataset.val_batches(batch_size=job.pipeline.micro_batch_size, seq_len=T, num_batches=job.report.eval_batches)
    except GeotrainError as e:
        errors.append(f"data (validation split): {e}")
