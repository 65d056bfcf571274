"""What a finished job leaves in its run directory, and ``geotrain export``.

What is in a *run directory* (``runs/<job id>``)? Besides the report and plots:

- ``job.json``: the resolved job (:mod:`geotrain.coordinator.prepare`);
- ``model.safetensors``: the final global model the stage groups agreed on,
  by stage-module name (``blocks.<i>.<name>``), with the step and round in its
  metadata;
- ``tokenizer/``: the job's tokenizer files (none for byte-level tokens).

:func:`export_run` turns that into a directory plain ``transformers`` loads
(``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained``) for Hugging Face
models, or into safetensors plus geotrain's config for the reference GPT.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from geotrain.config import JobSpec, job_from_dict
from geotrain.errors import ConfigError

__all__ = ["write_run_model", "export_run", "read_run"]


def write_run_model(run_dir: str | Path, job: JobSpec, state: Any) -> Path:
    """Write ``job.json``, ``model.safetensors`` and ``tokenizer/`` for ``state`` (a StageState of the whole model)."""
    from safetensors.torch import save_file

    from geotrain.data.job import dataset_for

    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.json").write_text(json.dumps(job.to_dict(), indent=2, sort_keys=True) + "\n")
    tensors = {n: t.detach().to("cpu").contiguous().clone() for n, t in state.params.items()}
    tmp = out / ".model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"job_id": str(state.job_id), "step": str(state.step),
                                           "round": str(state.round)})
    tmp.replace(out / "model.safetensors")
    tok = getattr(dataset_for(job), "tokenizer", None)
    if tok is not None and job.data.tokenizer != "bytes":  # byte-level tokens need no files
        tok.save(out / "tokenizer")
    return out / "model.safetensors"


def read_run(run_dir: str | Path) -> tuple[JobSpec, dict[str, Any], dict[str, str]]:
    """The resolved job, the final parameters and their metadata from a run directory."""
    from safetensors import safe_open

    d = Path(run_dir)
    if not (d / "job.json").is_file() or not (d / "model.safetensors").is_file():
        raise ConfigError(f"{d}: not a finished run directory (needs job.json and model.safetensors, written when "
                          "`geotrain run` ends with a final evaluation)")
    try:
        job = job_from_dict(json.loads((d / "job.json").read_text()))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{d / 'job.json'}: not JSON ({e})") from None
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        params = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
        meta = dict(f.metadata() or {})
    return job, params, meta


def export_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Export a finished run's final model (see the module docstring); returns ``out_dir``."""
    job, params, _ = read_run(run_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    m = job.model
    if m.is_hf:
        model = m.block_model(job.job.seed, device="meta")
        model.save_pretrained(params, out)
    elif m.loader is None:
        from geotrain.models.export import save_gpt_export

        save_gpt_export(m.gpt_config(), params, out)
    else:
        from safetensors.torch import save_file

        save_file({n: t.contiguous() for n, t in params.items()}, str(out / "model.safetensors"))
        (out / "geotrain_model.json").write_text(json.dumps({"kind": "loader", "loader": m.loader}) + "\n")
    tok_dir = Path(run_dir) / "tokenizer"
    if tok_dir.is_dir():
        for f in tok_dir.iterdir():
            if f.is_file():
                shutil.copy2(f, out / f.name)
    return out
