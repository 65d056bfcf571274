"""A closed swarm (swarm key): members train together; a peer without the key is neither planned nor admitted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from geotrain.cli.run import run_coordinator
from geotrain.config import job_from_dict
from geotrain.errors import PeerTimeoutError
from geotrain.local.procs import ChildGroup
from geotrain.local.swarm import start_local_swarm
from geotrain.swarm.keys import generate_swarm_key
from geotrain.transport import Message, Transport, TransportConfig
from tests.coordinator.test_job_e2e import tiny_job

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


def test_members_train_and_outsider_is_refused(children: ChildGroup, tmp_path: Path) -> None:
    key = generate_swarm_key(tmp_path / "swarm.key")
    swarm = start_local_swarm(
        children, regions=["us", "us", "eu", "eu"], job_id="closed", extra=["--swarm-key", str(key)]
    )
    # an outsider joins the same DHT without the key
    outsider = children.start("outsider", ["peer", "--initial-peers", *swarm.maddrs, "--region", "us",
                                           "--threads", "1", "--heartbeat", "2", "--job", "closed"])
    out_ready = outsider.wait_event("ready", timeout=120)
    report = run_coordinator(None, initial_peers=swarm.maddrs, job_id="closed", report_dir=tmp_path / "r",
                             job=job_from_dict(tiny_job(steps=20)), swarm_key=key)
    planned = {s["peer"] for plan in report["plans"] for pipe in plan["pipelines"] for s in pipe}
    planned |= {p for plan in report["plans"] for p in plan["spares"]}
    assert planned == set(swarm.peer_ids())
    assert out_ready["peer_id"] not in {p["peer_id"] for p in report["peers"]}
    assert report["summary"]["rounds"] >= 1
    errors = [e for e in report["events"] if e["kind"] == "error"]
    assert report["summary"]["val_loss_initial"] is not None, errors  # the seed's loss, fetched or not
    assert report["summary"]["val_loss_final"] is not None, errors  # the final state came back
    assert report["summary"]["val_loss_final"] < report["summary"]["val_loss_initial"]

    # a client with no CURVE credentials cannot talk to a member's data plane
    plain = Transport(TransportConfig(), peer_id="intruder").start()
    try:
        plain.connect("member", swarm.ready[0]["endpoint"])
        plain.send_async("member", Message(kind="state.get", tensors={"x": torch.ones(2)}))
        with pytest.raises(PeerTimeoutError):
            plain.request("member", Message(kind="probe.ping"), timeout=2.0)
    finally:
        plain.close()
