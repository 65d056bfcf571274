"""The control plane stays quiet: what a peer reads and writes, and how often, decided without a network.

The agent's and the heartbeat's pacing are tested with fakes in place of the DHT (every write recorded) and an
injected clock; the whole swarm's bytes are measured by ``benchmarks.control_plane`` (its smoke test).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from geotrain.peers.agent import AgentConfig, PeerAgent
from geotrain.swarm import SwarmConfig
from geotrain.swarm.records import PeerStatus


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _agent(**config: Any) -> tuple[PeerAgent, list[Any], _Clock]:
    published: list[Any] = []
    swarm = SimpleNamespace(peer_id="peer-a", admission=None,
                            config=SwarmConfig(record_ttl_s=120.0, heartbeat_s=30.0),
                            publish_progress=lambda rec, ttl_s: published.append(SimpleNamespace(
                                status=rec.status, job_id=rec.job_id, ttl=ttl_s)))
    transport = SimpleNamespace(config=SimpleNamespace(curve=None), stats=SimpleNamespace(dropped={}),
                                inbound_links=dict)
    agent = PeerAgent(AgentConfig(region="r0", **config), swarm=swarm, transport=transport)  # type: ignore[arg-type]
    clock = _Clock()
    agent._clock = clock
    return agent, published, clock


def test_a_peer_of_a_job_publishes_progress_every_liveness_period_and_at_once_when_it_changes() -> None:
    agent, published, clock = _agent(progress_every_s=10.0)
    agent._progress_tick()
    clock.t += 3.0
    assert not agent._progress_tick() and published == []  # no job known: nothing to say
    agent._following = "job-1"
    assert agent._progress_tick() and len(published) == 1  # it follows a job now: the coordinator must know
    assert published[0].status == PeerStatus.IDLE and published[0].job_id == "job-1"
    assert published[-1].ttl == 30.0 + 3.0  # 3 liveness periods and an RPC timeout: a peer that dies vanishes from the job as fast
    for _ in range(3):  # nothing changed: quiet, however often the loop ticks
        clock.t += 3.0
        assert not agent._progress_tick()
    clock.t += 1.0  # a liveness period (10 s) since the last one
    assert agent._progress_tick() and len(published) == 2

    plan = SimpleNamespace(job_id="job-1", version=3, pipelines=[])
    worker = SimpleNamespace(round=4, stats=dict, last_loss=2.5, tokens=100)
    agent._plan, agent._worker, agent._status = plan, worker, PeerStatus.TRAINING
    agent.transport.stats = SimpleNamespace(dropped={}, sent_bytes={}, recv_bytes={})
    assert agent._progress_tick() and published[-1].status == PeerStatus.TRAINING  # a new status: at once
    clock.t += 2.0
    assert not agent._progress_tick()  # steps moved on, but the period is 10 s
    worker.round = 5
    assert not agent._progress_tick()  # a round committed 2 s after the last write: it waits for half a period
    clock.t += 3.0
    assert agent._progress_tick()  # (validation and manifests follow rounds, a few seconds late at most)
    worker.round = 6
    clock.t += 4.0
    assert not agent._progress_tick()
    agent._status = PeerStatus.STALLED
    assert agent._progress_tick()  # a status change goes out at once, whatever the pace
    clock.t += 10.0
    assert agent._progress_tick() and len(published) == 6


def test_the_liveness_period_is_the_jobs_heartbeat_or_the_command_lines_when_shorter() -> None:
    agent, _, _ = _agent(progress_every_s=10.0)
    assert agent._liveness_s() == 10.0
    agent._job = SimpleNamespace(swarm=SimpleNamespace(heartbeat_s=4.0))  # type: ignore[assignment]
    assert agent._liveness_s() == 4.0
    agent.swarm.config = SwarmConfig(record_ttl_s=120.0, heartbeat_s=2.0)  # type: ignore[misc]  # geotrain peer --heartbeat 2
    assert agent._liveness_s() == 2.0


def test_the_watcher_waits_for_news_long_and_polls_fast_only_when_stalled() -> None:
    agent, _, _ = _agent(poll_s=2.0, watch_every_s=30.0, watch_idle_s=10.0)
    assert agent._watch_period() == 10.0  # no job yet: the coordinator's news of one comes, or this poll
    agent._following = "job-1"
    assert agent._watch_period() == 30.0  # following a job: a new plan comes with news
    agent._status = PeerStatus.STALLED
    assert agent._watch_period() == 2.0  # a replan is expected and its news may be lost


def test_the_coordinator_tells_each_new_peer_of_its_job_once(monkeypatch: Any) -> None:
    import geotrain.coordinator.coordinator as coord_mod

    sent: list[list[str]] = []
    monkeypatch.setattr(coord_mod, "send_news", lambda transport, contacts, kind: sent.append(
        [c.peer_id for c in contacts]) if kind == coord_mod.JOB_NEWS else None)
    coord = object.__new__(coord_mod.Coordinator)
    coord.transport, coord._told = SimpleNamespace(), set()  # type: ignore[assignment]

    def rec(endpoint: str) -> Any:
        return SimpleNamespace(endpoint=endpoint, region="r0", curve_public_key=None)

    coord._tell_job({"a": rec("tcp://127.0.0.1:1"), "b": rec("tcp://127.0.0.1:2")})
    coord._tell_job({"a": rec("tcp://127.0.0.1:1"), "b": rec("tcp://127.0.0.1:2"), "c": rec("dialback://x")})
    coord._tell_job({"a": rec("tcp://127.0.0.1:1"), "d": rec("tcp://127.0.0.1:4")})
    # a peer behind NAT (dialback) cannot be dialled: it finds the job at its own poll
    assert sent == [["a", "b"], ["d"]]


def test_a_peer_in_a_plan_reads_the_peer_list_at_its_slow_in_plan_period() -> None:
    """The peer list is O(N) bytes per read; a peer in a plan probes nobody and its plan names its partners: it
    reads the list every ``view_in_plan_s`` (a refused key or a new plan still wakes it at once)."""
    agent, _, _ = _agent(view_every_s=30.0, view_per_peer_s=8.0, view_in_plan_s=90.0)
    agent._started -= 1000.0  # past its first view_every_s
    agent._seen = 8
    periods: list[float] = []

    def wait(period: float) -> None:
        periods.append(period)
        if len(periods) == 2:
            agent._stop.set()
        agent._plan = SimpleNamespace(job_id="job-1", version=1)  # type: ignore[assignment]  # placed from now on

    agent._probe_once = lambda: False  # type: ignore[method-assign]
    agent._wait_view = wait  # type: ignore[method-assign]
    agent._probe_loop()
    assert periods == [64.0, 90.0]  # N x 8 s before the plan; 90 s in it


def test_the_liveness_records_can_go_to_fewer_replicas_than_the_others() -> None:
    """The peer record is kept by ``liveness_replicas`` nodes (5 by default, as every other record), the
    progress record by ``progress_replicas`` (3 by default); a link row, job or plan by all 5; a link row lives
    ``links_ttl_s`` (``max_ttl_s`` when shorter)."""
    from geotrain.swarm.records import LinkRow, ProgressRecord
    from geotrain.swarm.swarm import Swarm
    from tests.swarm.test_records import peer_record

    for config, want in ((SwarmConfig(), [("progress", 3), ("peers", 5), ("links", None)]),
                         (SwarmConfig(liveness_replicas=3, progress_replicas=2),
                          [("progress", 2), ("peers", 3), ("links", None)])):
        swarm = Swarm(config)
        calls: list[tuple[str, int | None]] = []
        ttls: dict[str, float] = {}

        def publish(kind: str, record: object, ttl_s: float, replicas: int | None = None, *,
                    calls: list[tuple[str, int | None]] = calls, ttls: dict[str, float] = ttls) -> bool:
            calls.append((kind, replicas))
            ttls[kind] = ttl_s
            return True

        swarm._publish = publish  # type: ignore[method-assign]
        swarm.publish_progress(ProgressRecord(peer_id=swarm.peer_id, job_id="j", plan_version=1, step=0, tokens=0,
                                              round=0, bytes_sent=0, bytes_received=0, updated_at=0.0))
        swarm.publish_peer(peer_record(swarm.peer_id))
        swarm.publish_links(LinkRow(src=swarm.peer_id, links={}))
        assert calls == want
        assert ttls["links"] == 480.0
    assert SwarmConfig(max_ttl_s=60.0, heartbeat_s=1.0, record_ttl_s=30.0).links_lifetime_s == 60.0


def test_liveness_replicas_are_bounded_by_hiveminds_five_and_the_read_beam() -> None:
    import pytest

    from geotrain.errors import ConfigError

    for bad in (0, 6):
        with pytest.raises(ConfigError, match="liveness_replicas"):
            SwarmConfig(liveness_replicas=bad)
    with pytest.raises(ConfigError, match="liveness_replicas"):
        SwarmConfig(read_beam=2, liveness_replicas=3)  # a thorough read could miss every copy
    for bad in (0, 6):
        with pytest.raises(ConfigError, match="progress_replicas"):
            SwarmConfig(progress_replicas=bad)
    with pytest.raises(ConfigError, match="links_ttl_s"):
        SwarmConfig(links_ttl_s=0.0)
