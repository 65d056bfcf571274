"""A job's Hugging Face model: the ``[model]`` section's ``hf_config`` / ``hf_pretrained`` as a block model.

What does a peer need to build the model? Only the job record. A resolved job
(``geotrain run`` / ``geotrain check``) carries the model's ``config.json``
itself (``model.hf_config_json``), the tokenizer's vocabulary
(``model.vocab_size``) and, for ``hf_pretrained``, the SHA-256 of the weights
(``model.weights_digest``). A peer builds ``hf_config`` models from the record
alone (seeded: every peer gets identical weights); ``hf_pretrained`` models need
the weights on the peer's own disk (``geotrain peer --model-dir``), and a peer
whose weights differ from the job's is refused before it trains.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from geotrain.errors import ConfigError

__all__ = ["hf_block_model", "read_hf_config", "materialise_config"]


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The JSON of a ``config.json`` (or of the one inside a directory), with a clear error when unusable."""
    p = Path(path)
    f = p / "config.json" if p.is_dir() else p
    if not f.is_file():
        raise ConfigError(f"{str(p)!r}: no such file{'' if p.is_dir() else ' or directory'}"
                          f"{' (no config.json in it)' if p.is_dir() else ''}; give a transformers config.json "
                          "or a directory holding one")
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{f}: not a readable JSON config ({e})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{f}: a transformers config needs a 'model_type' key (e.g. \"llama\"); this file has none")
    return data


def materialise_config(config_json: str) -> Path:
    """A directory holding ``config_json`` as ``config.json`` (for transformers' loaders), keyed by its digest."""
    digest = hashlib.sha256(config_json.encode("utf-8")).hexdigest()[:32]
    root = Path(tempfile.gettempdir()) / "geotrain-hf-config" / digest
    target = root / "config.json"
    if not target.is_file() or target.read_text(encoding="utf-8") != config_json:
        root.mkdir(parents=True, exist_ok=True)
        # a name of this process's own: peers on one machine materialise the same config at once
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".config.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(config_json)
        os.replace(tmp, target)  # atomic: a concurrent reader sees no file or the whole one
    return root


@functools.lru_cache(maxsize=4)
def _digest_of(directory: str, mtime_ns: int) -> str:
    from geotrain.models.hf import weights_digest

    return weights_digest(directory)


def _check_weights(directory: str, expected: str | None) -> None:
    if expected is None:
        return
    p = Path(directory)
    files = sorted(p.glob("*.safetensors"))
    stamp = max((f.stat().st_mtime_ns for f in files), default=0)
    actual = _digest_of(str(p), stamp)
    if actual != expected:
        raise ConfigError(
            f"model.hf_pretrained {directory!r} on this peer has weights with SHA-256 {actual[:16]}..., but the job "
            f"was launched from weights {expected[:16]}...; give this peer the same checkpoint (--model-dir)"
        )


@functools.lru_cache(maxsize=4)
def _build(kind: str, where: str, seed: int, seq_len: int | None, vocab_size: int | None, ckpt: bool, device: str) -> Any:
    from geotrain.models.hf import HFModel

    if kind == "pretrained":
        return HFModel.from_pretrained(where, seq_len=seq_len, activation_checkpointing=ckpt)
    return HFModel.from_config(where, seed=seed, seq_len=seq_len, vocab_size=vocab_size,
                               activation_checkpointing=ckpt, device=device)


def hf_block_model(model: Any, *, seed: int, device: str = "cpu") -> Any:
    """The block model of a ``[model]`` section with ``hf_config`` or ``hf_pretrained`` (see the module docstring).

    Built once per process and arguments; ``build_block`` hands out copies, so callers share nothing.
    """
    if model.hf_pretrained is not None and device != "meta":
        _check_weights(model.hf_pretrained, model.weights_digest)
        built = _build("pretrained", str(model.hf_pretrained), seed, model.seq_len, None,
                       model.activation_checkpointing, device)
        if model.vocab_size is not None and model.vocab_size > built.vocab_size:
            raise ConfigError(
                f"the tokenizer has {model.vocab_size} tokens but model.hf_pretrained's embedding has only "
                f"{built.vocab_size}; use the tokenizer the model was trained with"
            )
        return built
    if model.hf_config_json is not None:
        where = str(materialise_config(model.hf_config_json))
    elif model.hf_config is not None:
        where = str(model.hf_config)
    else:
        where = str(model.hf_pretrained)  # meta build of a pretrained model: its config is enough
    vocab = model.vocab_size if model.hf_pretrained is None else None
    return _build("config", where, seed, model.seq_len, vocab, model.activation_checkpointing, device)
