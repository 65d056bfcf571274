"""A job's dataset on this process, checked against the digests the resolved job carries.

Every reader of a job's tokens goes through :func:`dataset_for`: a peer's stage worker, the coordinator's
evaluation and export. The resolved job (``geotrain.coordinator.prepare``) fills in the tokenizer's and the
token cache's digests; :func:`check_peer_data` refuses tokens that differ from them.
"""

from __future__ import annotations

from typing import Any

from geotrain.config import JobSpec
from geotrain.errors import ConfigError

# one job's dataset per process (every stage of a peer shares it); a new job's data replaces the last one's
_datasets: dict[Any, Any] = {}


def check_peer_data(job: JobSpec, dataset: Any) -> None:
    """A peer's own tokenizer and tokens against the resolved job's; ConfigError naming what differs."""
    want_tok, want_data = job.data.tokenizer_digest, job.data.digest
    tok = getattr(dataset, "tokenizer", None)
    have_tok, have_data = getattr(tok, "digest", None), getattr(dataset, "digest", None)
    if want_tok is not None and have_tok != want_tok:
        raise ConfigError(
            f"this peer's tokenizer ({job.data.tokenizer!r}, digest {str(have_tok)[:16]}...) differs from the job's "
            f"(digest {want_tok[:16]}...); refusing to train: give this peer the same tokenizer files"
        )
    if want_data is not None and have_data != want_data:
        raise ConfigError(
            f"this peer's tokens of data.path {job.data.path!r} (digest {str(have_data)[:16]}...) differ from the "
            f"job's (digest {want_data[:16]}...); refusing to train: give this peer the same corpus (--data-dir)"
        )


def dataset_for(job: JobSpec) -> Any:
    """The job's dataset, loaded once per process, checked against the resolved job's tokenizer and token
    digests (:func:`check_peer_data`)."""
    from geotrain.data import build_dataset

    key = job.data
    if key not in _datasets:
        ds = build_dataset(job.data.data_config())
        check_peer_data(job, ds)
        _datasets.clear()
        _datasets[key] = ds
    return _datasets[key]
