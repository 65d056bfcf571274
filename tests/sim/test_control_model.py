"""The simulator's control-plane model: the same cadence the peers and the coordinator run with, flat in N."""

from __future__ import annotations

import pytest

from geotrain.cli import build_parser
from geotrain.config import SwarmSection
from geotrain.coordinator.coordinator import CoordinatorConfig
from geotrain.peers.agent import AgentConfig
from geotrain.sim.control import Cadence, DHTCosts, connections_per_node, control_plane_cost
from geotrain.swarm.swarm import SwarmConfig


def test_the_models_cadence_is_the_one_peers_and_coordinators_run_with() -> None:
    c, a = Cadence(), AgentConfig(region="r")
    cli = build_parser().parse_args(["peer", "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/QmX", "--region", "r"])
    assert c.heartbeat_s == cli.heartbeat
    assert c.liveness_s == min(SwarmSection().heartbeat_s, a.progress_every_s)
    assert (c.watch_s, c.view_s, c.view_per_peer_s) == (a.watch_every_s, a.view_every_s, a.view_per_peer_s)
    assert c.view_in_plan_s == a.view_in_plan_s
    assert DHTCosts().liveness_replicas == SwarmConfig().liveness_replicas
    assert DHTCosts().progress_replicas == SwarmConfig().progress_replicas
    assert a.watch_idle_s == c.watch_s
    assert c.links_ttl_s == SwarmConfig().links_lifetime_s
    assert c.idle_connection_s == SwarmConfig().idle_connection_s
    coordinator = CoordinatorConfig(job_id="j", report_dir=".")  # type: ignore[arg-type]
    assert c.coordinator_watch_s == coordinator.watch_every_s
    assert (c.coordinator_peers_s, c.coordinator_full_s) == (coordinator.peers_every_s, coordinator.full_read_every_s)


def test_a_peers_cost_does_not_grow_with_the_swarm_and_the_coordinator_reads_a_constant_number_of_times() -> None:
    for training in (False, True):
        per_peer = {n: control_plane_cost(n, regions=4, round_s=60.0, training=training)["bytes_per_peer_s"]
                    for n in (8, 32, 100, 1000, 10000)}
        # bounded: it grows while the periods sit at their floors (30 s, 5 min), then stays flat
        assert per_peer[1000] / per_peer[32] <= 1.05 and per_peer[10000] / per_peer[100] <= 1.05, per_peer
        assert per_peer[32] / per_peer[8] <= 2.0, per_peer
    reads = {n: control_plane_cost(n, round_s=60.0)["coordinator_reads_per_min"] for n in (8, 1000)}
    assert reads[8] == reads[1000] > 0
    # its bytes do grow with N (a digest line per member each watch, every record each full read), linearly,
    # and the digests cut them several times against reading every record each watch
    coord = {n: control_plane_cost(n, regions=4, round_s=60.0)["coordinator_bytes_s"] for n in (100, 1000)}
    assert 5 < coord[1000] / coord[100] < 11
    every_tick = Cadence(coordinator_full_s=Cadence().coordinator_watch_s)
    flat = control_plane_cost(1000, regions=4, round_s=60.0, cadence=every_tick)["coordinator_bytes_s"]
    assert flat / coord[1000] > 2.5, (flat, coord)


def test_a_node_that_is_one_of_a_keys_replicas_writes_and_reads_that_copy_locally() -> None:
    """In a small swarm most nodes hold most keys: a write keeps one copy at home, a quick read is answered from
    home, so a peer of 8 costs less than one of 32 (the measured idle growth from 8 to 32 is this term)."""
    d = DHTCosts()
    assert d.store(100.0, 5, peers=5) == 4 * (d.rpc + 100.0)  # every node is a replica: one copy is its own
    assert d.store(100.0, 5, peers=1000) > 4.97 * (d.rpc + 100.0)
    assert d.read(8, 1000.0, peers=5) == 0.0 and d.read(8, 1000.0, peers=5, thorough=True) > 0.0
    idle = {n: control_plane_cost(n, regions=4, training=False)["bytes_per_peer_s"] for n in (8, 32, 1000)}
    assert idle[8] < idle[32] and abs(idle[1000] / idle[32] - 1.0) < 0.05, idle


def test_connections_kept_open_are_the_nodes_used_within_the_idle_limit_flat_in_n() -> None:
    """Measured idle (benchmarks.control_plane): 34.8 connections per node at N = 32 kept forever, 18.5 with the
    60 s limit; at N = 8 every node talks to every other either way."""
    never, closing = Cadence(idle_connection_s=0.0), Cadence()
    conns = {(n, c.idle_connection_s): control_plane_cost(n, regions=4, training=False, cadence=c)
             for n in (8, 32, 1000) for c in (never, closing)}
    assert conns[(8, 0.0)]["connections_per_node"] == conns[(8, 60.0)]["connections_per_node"] == 7.0
    assert conns[(32, 0.0)]["connections_per_node"] > 1.4 * conns[(32, 60.0)]["connections_per_node"]
    assert 12 < conns[(32, 60.0)]["connections_per_node"] < 24
    assert abs(conns[(1000, 60.0)]["connections_per_node"] / conns[(32, 60.0)]["connections_per_node"] - 1) < 0.1
    assert conns[(1000, 0.0)]["bytes_per_peer_s"] > conns[(1000, 60.0)]["bytes_per_peer_s"]
    # the set of nodes used: one key's 5 replicas every 30 s is a star around them (2R - R^2/N), never over N - 1
    assert connections_per_node(100, [(5, 30.0)], idle_s=60.0) == pytest.approx(2 * 5 - 25 / 100)
    assert connections_per_node(4, [(5, 30.0)], idle_s=60.0) == 3.0
    assert connections_per_node(1, [(5, 30.0)], idle_s=60.0) == 0.0
    # an operation every 10 minutes barely holds a connection open with a 60 s limit
    assert connections_per_node(100, [(5, 600.0)], idle_s=60.0) < 1.5
