"""Streaming DiLoCo on the embedded task: fragments + overlap lose nothing against blocking rounds."""

from __future__ import annotations

import pytest
import torch

from benchmarks.sync import Setup, run_geotrain
from geotrain.data import DataConfig, TokenDataset, build_dataset
from geotrain.sync import DiLoCoConfig


@pytest.fixture(scope="module")
def task() -> tuple[Setup, TokenDataset]:
    torch.set_num_threads(1)
    setup = Setup(replicas=2, regions=2, steps=60, batch=8, val_batches=4, data_bytes=1 << 20)
    return setup, build_dataset(DataConfig(max_bytes=setup.data_bytes))


def test_streaming_fragments_with_overlap_match_blocking_diloco(task: tuple[Setup, TokenDataset]) -> None:
    setup, data = task
    common = {"every": 10, "cross_codec": "none", "deadline_floor_s": 10.0}
    blocking = run_geotrain(setup, data, DiLoCoConfig(fragments=1, overlap=0, **common))  # type: ignore[arg-type]
    streaming = run_geotrain(setup, data, DiLoCoConfig(fragments=3, overlap=1, **common))  # type: ignore[arg-type]
    assert blocking["rounds_committed"] == 6 and blocking["rounds_discarded"] == 0
    assert streaming["rounds_committed"] == 18 and streaming["rounds_discarded"] == 0
    assert blocking["replicas_identical"] and streaming["replicas_identical"]
    assert streaming["final_loss"] <= blocking["final_loss"] * 1.02, (streaming, blocking)
    # streaming sends each fragment on its own schedule: the same bytes in total, not more
    assert streaming["cross_region_bytes"] <= blocking["cross_region_bytes"] * 1.1


def test_streaming_int4_error_feedback_stays_close(task: tuple[Setup, TokenDataset]) -> None:
    setup, data = task
    base = run_geotrain(setup, data, DiLoCoConfig(every=10, fragments=2, overlap=1, cross_codec="none"))
    int4 = run_geotrain(setup, data, DiLoCoConfig(every=10, fragments=2, overlap=1, cross_codec="int4"))
    assert int4["final_loss"] <= base["final_loss"] * 1.02, (int4, base)
    assert int4["cross_region_bytes"] * 4 < base["cross_region_bytes"]
