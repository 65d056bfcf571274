"""One setting, one name, one range, one default: the job's sync section reaches each stage group's
DiLoCoConfig as is, and what a stage cannot honour (more fragments than tensors) is said, not hidden."""

from __future__ import annotations

import logging

import pytest
import torch

from geotrain.config import DEFAULT_SYNC_EVERY, JobSpec, SyncSection, job_from_dict
from geotrain.errors import ConfigError
from geotrain.planner.scenario import Job as ScenarioJob
from geotrain.sync import DiLoCoConfig
from geotrain.transport import Transport
from tests.peers.test_worker_commit import _worker, transport  # noqa: F401 (fixture)


def _job(**sync: object) -> JobSpec:
    return job_from_dict({
        "job": {"name": "cfg", "seed": 0}, "model": {"preset": "tiny"}, "data": {"max_bytes": 1 << 18},
        "pipeline": {"micro_batch_size": 2, "microbatches": 1}, "sync": {"codec": "none", **sync},
    })


def test_sync_every_has_one_default_everywhere() -> None:
    assert SyncSection().every == DiLoCoConfig().every == ScenarioJob().sync_every == DEFAULT_SYNC_EVERY
    assert job_from_dict({"job": {"name": "t"}, "model": {"preset": "tiny"}}).sync.every == DiLoCoConfig().every


@pytest.mark.parametrize("mixing", [1.0, 1.5, -0.1, float("nan")])
def test_mixing_has_one_range_everywhere(mixing: float) -> None:
    with pytest.raises(ConfigError) as job_error:
        SyncSection(mixing=mixing)
    with pytest.raises(ConfigError) as sync_error:
        DiLoCoConfig(mixing=mixing)
    assert str(job_error.value) == str(sync_error.value)
    assert "[0, 1)" in str(job_error.value)
    with pytest.raises(ConfigError, match="sync.mixing"):
        _job(mixing=mixing)


def test_the_worker_passes_mixing_as_is(transport: Transport) -> None:  # noqa: F811
    job = _job(mixing=0.995, every=4, fragments=2, overlap=1)
    assert DiLoCoConfig(mixing=0.995).mixing == 0.995  # in range for both layers
    w = _worker(job, transport)
    try:
        (sync,) = w.syncs
        assert sync.config.mixing == 0.995 and sync.config.fragments == 2 and sync.config.overlap == 1
        assert sync.config.every == 4 and sync.config.cross_codec == "none"
    finally:
        w.close()


def test_more_fragments_than_tensors_get_fewer_fragments_and_say_so(
    transport: Transport, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    job = _job(every=64, fragments=60)
    with caplog.at_level(logging.WARNING, logger="geotrain.peers.worker"):
        w = _worker(job, transport)
    try:
        (sync,) = w.syncs
        tensors = len(list(w.stage.named_parameters()))
        assert tensors < 60 and sync.config.fragments == tensors == len(sync.fragments)
        (line,) = [r.getMessage() for r in caplog.records if "sync.fragments" in r.getMessage()]
        assert "sync.fragments = 60" in line and f"hold {tensors} parameter tensors" in line
        assert f"syncs in {tensors} fragments" in line
    finally:
        w.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="geotrain.peers.worker"):
        w = _worker(_job(every=64, fragments=4), transport)  # enough tensors: nothing to say
    try:
        assert w.syncs[0].config.fragments == 4
        assert not [r for r in caplog.records if "sync.fragments" in r.getMessage()]
    finally:
        w.close()


def test_merged_microbatches_take_one_pass_and_the_same_step(transport: Transport) -> None:  # noqa: F811
    """``pipeline.merge_microbatches``: a one-stage pipeline runs the step's 4 microbatches as one pass, and its
    optimizer step is the one the 4 accumulated microbatches give (up to the order of float sums)."""
    def job(merge: bool) -> JobSpec:
        return job_from_dict({
            "job": {"name": "cfg", "seed": 0}, "model": {"preset": "tiny"}, "data": {"max_bytes": 1 << 18},
            "pipeline": {"micro_batch_size": 2, "microbatches": 4, "merge_microbatches": merge},
            "sync": {"codec": "none", "every": 100},
        })

    after = {}
    for merge in (False, True):
        w = _worker(job(merge), transport)
        try:
            assert w.runtime.config.microbatches == (1 if merge else 4)
            forwards = [op for op, _ in w.runtime.ops if op == "F"]
            assert len(forwards) == w.runtime.config.microbatches
            m = w.step(0)
            assert m.tokens == 8 * w.job.model.context  # the whole batch either way
            after[merge] = (m.loss, {n: p.detach().clone() for n, p in w.stage.named_parameters()})
        finally:
            w.close()
    assert after[True][0] == pytest.approx(after[False][0], rel=1e-6)
    for n, p in after[False][1].items():
        torch.testing.assert_close(after[True][1][n], p, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="merge_microbatches"):
        job_from_dict({"job": {"name": "t"}, "model": {"preset": "tiny"},
                       "pipeline": {"merge_microbatches": "yes"}})
