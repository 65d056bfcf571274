"""A spare's progress record speaks of the job it follows only.

A spare has no worker; its record carries the round of the last state it held. That state may be of an
earlier job the peer trained (a swarm follows the newest job): its rounds are not this job's, and a
coordinator that takes the highest round among its job's records would report them as its own.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from geotrain.peers.agent import AgentConfig, PeerAgent
from geotrain.plan import JobPlan, StageSlot
from geotrain.swarm.records import PeerStatus
from geotrain.sync.state import StageState
from geotrain.transport.queues import TransportStats


def _agent() -> tuple[PeerAgent, list[Any]]:
    published: list[Any] = []
    swarm = SimpleNamespace(
        peer_id="spare", admission=None,
        config=SimpleNamespace(record_ttl_s=30.0, links_lifetime_s=30.0, heartbeat_s=5.0,
                              liveness_ttl_s=lambda period: 3 * period),
        publish_progress=lambda record, ttl_s: published.append(record),
    )
    transport = SimpleNamespace(config=SimpleNamespace(curve=None), dial_out=False, stats=TransportStats(),
                                inbound_links=dict)
    agent = PeerAgent(AgentConfig(region="eu"), swarm=swarm, transport=transport)  # type: ignore[arg-type]
    return agent, published


def _spare_of(job_id: str) -> JobPlan:
    return JobPlan(job_id=job_id, version=1, num_blocks=2, sync_codec="none", spares=("spare",),
                   pipelines=((StageSlot(peer="other", start=0, end=2, endpoint="tcp://127.0.0.1:1", region="eu"),),))


def _state(job_id: str, rnd: int) -> StageState:
    return StageState(job_id, rnd, rnd * 5, {"blocks.0.w": torch.zeros(2)})


def test_a_spare_reports_no_round_of_another_job() -> None:
    agent, published = _agent()
    agent._plan, agent._status = _spare_of("job-b"), PeerStatus.SPARE
    agent._last_state = _state("job-a", 4)  # what it trained in the swarm's previous job
    agent._publish_progress(0, None)
    assert published[-1].job_id == "job-b" and published[-1].round == 0


def test_a_spare_reports_the_round_it_holds_of_its_job() -> None:
    agent, published = _agent()
    agent._plan, agent._status = _spare_of("job-b"), PeerStatus.SPARE
    agent._last_state = _state("job-b", 3)  # placed in an earlier plan of this job, a spare now
    agent._publish_progress(15, None)
    assert published[-1].round == 3 and published[-1].status == PeerStatus.SPARE
