"""The live planner's scenario carries what the runtime will do (geotrain.coordinator.planning)."""

from __future__ import annotations

import time

import pytest

from geotrain.config import job_from_dict
from geotrain.coordinator.planning import scenario_dict
from geotrain.planner.scenario import Scenario
from geotrain.swarm.records import JobRecord, PeerRecord


def _peer(pid: str, region: str) -> PeerRecord:
    now = time.time()
    return PeerRecord(peer_id=pid, region=region, device="cpu", flops=1e12, memory_bytes=2**34, usd_per_hour=1.0,
                      endpoint="tcp://127.0.0.1:5555", version="0.1", started_at=now, heartbeat_at=now)


@pytest.mark.parametrize("intra", ["none", "int8"])
def test_scenario_prices_the_intra_region_leg_with_the_jobs_intra_codec(intra: str) -> None:
    job = job_from_dict({"job": {"name": "t"}, "model": {"preset": "tiny"}, "sync": {"intra_codec": intra}})
    peers = {"QmA": _peer("QmA", "eu"), "QmB": _peer("QmB", "us")}
    d = scenario_dict(job, peers, {})
    assert d["job"]["sync_intra_codec"] == intra
    assert Scenario.from_dict(d).job.sync_intra_codec == intra


def test_job_record_endpoint_must_be_a_tcp_address() -> None:
    ok = JobRecord(job_id="j", spec={}, published_at=time.time(), endpoint="tcp://10.0.0.1:4000")
    assert ok.endpoint == "tcp://10.0.0.1:4000"
    with pytest.raises(ValueError, match="tcp://"):
        JobRecord(job_id="j", spec={}, published_at=time.time(), endpoint="ipc:///tmp/x; rm -rf /")
