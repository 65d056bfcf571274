"""The reference GPT as files: ``model.safetensors`` plus ``geotrain_model.json``, and back.

Hugging Face models export to a directory ``transformers`` loads
(:meth:`geotrain.models.hf.HFModel.save_pretrained`); the reference GPT is not a
``transformers`` architecture, so it is written as safetensors (parameter names
as in a whole-model :class:`~geotrain.models.stage.StageModule`,
``blocks.<i>.<name>``) with its shape beside it. Load it with
:func:`load_gpt_export`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from geotrain.errors import ConfigError
from geotrain.models.gpt import GPTConfig
from geotrain.models.stage import StageModule, build_stage

__all__ = ["save_gpt_export", "load_gpt_export", "GPT_CONFIG_FILE"]

GPT_CONFIG_FILE = "geotrain_model.json"


def save_gpt_export(config: GPTConfig, params: dict[str, torch.Tensor], out_dir: str | Path) -> Path:
    """Write ``params`` (a whole model's, by stage-module name) and ``config`` into ``out_dir``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # a tied head shares the embedding's storage: safetensors stores each tensor on its own
    tensors = {n: t.detach().to("cpu").contiguous().clone() for n, t in params.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt", "geotrain": "gpt"})
    (out / GPT_CONFIG_FILE).write_text(json.dumps({"kind": "gpt", **dataclasses.asdict(config)}, indent=2) + "\n")
    return out


def load_gpt_export(directory: str | Path) -> StageModule:
    """The whole reference GPT from an export directory: ``model(tokens (B, T)) -> logits (B, T, V)``."""
    from safetensors.torch import load_file

    d = Path(directory)
    try:
        meta = json.loads((d / GPT_CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{d}: not a geotrain GPT export (no readable {GPT_CONFIG_FILE}: {e})") from None
    if meta.pop("kind", None) != "gpt":
        raise ConfigError(f"{d / GPT_CONFIG_FILE}: not a reference-GPT export")
    config = GPTConfig(**meta)
    model = build_stage(config, (0, config.num_blocks), seed=0)
    params = load_file(str(d / "model.safetensors"))
    own = dict(model.named_parameters())
    missing = sorted(set(own) - set(params))
    if missing:
        raise ConfigError(f"{d}: model.safetensors lacks {len(missing)} parameters, e.g. {missing[:3]}")
    with torch.no_grad():
        for name, p in own.items():
            p.copy_(params[name].view_as(p))
    return model
