"""A job as this peer sees it: the job's data and model paths mapped onto the peer's own copies.

Why? A job names its data (``data.path``, a tokenizer path) and pretrained
weights (``model.hf_pretrained``) as the coordinator's machine spells them. A
peer in another cloud holds its own copy somewhere else: ``geotrain peer
--data-dir DIR`` and ``--model-dir DIR`` say where. A relative path is taken
under that directory; an absolute one that does not exist on this machine is
looked up by its last component there. The digests in the resolved job prove
afterwards that the copies are the same (a peer whose copy differs refuses).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from geotrain.config import JobSpec

__all__ = ["localise_job", "local_path"]


def local_path(path: str | None, base: str | Path | None) -> str | None:
    """``path`` mapped under ``base`` (see the module docstring); unchanged without a base."""
    if path is None or base is None:
        return path
    p = Path(path)
    if not p.is_absolute():
        return str(Path(base) / p)
    if p.exists():
        return path
    return str(Path(base) / p.name)


def localise_job(job: JobSpec, *, data_dir: str | Path | None = None, model_dir: str | Path | None = None) -> JobSpec:
    """``job`` with its data, tokenizer and pretrained-weights paths mapped onto this peer's directories."""
    data, model = job.data, job.model
    tok = data.tokenizer
    if data_dir is not None and tok != "bytes" and not tok.startswith("bpe:"):
        tok = local_path(tok, data_dir) or tok
    if data_dir is not None:
        data = dataclasses.replace(data, path=local_path(data.path, data_dir), tokenizer=tok)
    if model_dir is not None and model.hf_pretrained is not None:
        model = dataclasses.replace(model, hf_pretrained=local_path(model.hf_pretrained, model_dir))
    if data is job.data and model is job.model:
        return job
    return dataclasses.replace(job, data=data, model=model)
