"""The control plane's cost, modelled: DHT bytes per peer per second and the coordinator's reads.

The terms are the ones the peers and the coordinator run with (``geotrain.peers.agent.AgentConfig``,
``geotrain.coordinator.coordinator.CoordinatorConfig``, ``geotrain.swarm.swarm.SwarmConfig``; their
defaults are repeated in :class:`Cadence`, which a test keeps equal to them), and hivemind's cost of one
operation, fitted to what ``benchmarks.control_plane`` measures on loopback (:class:`DHTCosts`).

One operation costs, in bytes sent by every node together (IP and TCP headers included), less what a
node that is itself one of the key's replicas keeps or answers locally (probability ``replicas / N``: most
of a small swarm's nodes hold most keys, which is why a swarm of 8 costs less per peer than one of 32):

- a write (*store*) of a ``v``-byte record goes straight to the key's ``replicas``: ``replicas x (rpc + v)``;
  the replicas are looked up again every ``max(300 s, 10 s x N)``, by the key's sibling id, so every node
  that lookup asks (``beam``) answers with a list of nodes, not the key's dictionary:
  ``beam x (rpc + find_answer)``;
- a quick read (one replica's copy): ``(lookup + 1) x rpc + m x r``; a thorough read asks ``beam``
  replicas: ``(lookup + beam) x rpc + beam x m x r``.

Per peer, idle (joined, no job): a heartbeat every ``heartbeat_s``, a quick read of the peer list every
``max(view_s, view_per_peer_s x N)``, a read of the job records every ``watch_s`` and its link row
republished every ``links_ttl_s / 2``. In a job it reads the peer list every ``view_in_plan_s`` at
least, and adds a progress write every ``liveness_s`` and at each round (the progress record is the job's
liveness signal); the peer record is kept by ``liveness_replicas`` of the key's nearest nodes, the
progress record by ``progress_replicas``, the others by 5. The plan (O(N) bytes) is read only when the job
record's version pointer moves, i.e. once per replan, which this steady-state figure leaves out.

Every libp2p connection a node keeps open costs its keep-alives (``connection_s`` per end, fitted to the
growth measured from 8 to 32 peers with every connection kept): a node keeps the ones it used within
``idle_connection_s`` (:func:`connections_per_node`), about 17 idle at any N past 32 with the 60 s default,
and a full mesh of a few dozen without closing.

Each region's collector writes its region's progress digest (``digest_record`` plus ``digest_line`` per
member, to ``progress_replicas``) every ``liveness_s``; its members' lines reach it over the data plane, not
the DHT, and are not counted here. The coordinator reads the ``regions`` digests (quick) every
``coordinator_watch_s``, every peer's progress record and the peer dictionary (quick) every
``coordinator_full_s`` (the peer dictionary no sooner than ``coordinator_peers_s``), and writes the plan each
round (its manifest): its reads per minute are constant; their bytes are O(N), but a member costs a digest
line per watch (``digest_line``) instead of a signed record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Cadence", "DHTCosts", "connections_per_node", "control_plane_cost"]


@dataclass(frozen=True)
class Cadence:
    """How often each control-plane operation happens (seconds), as the peer and coordinator run by default."""

    heartbeat_s: float = 30.0  # geotrain peer --heartbeat: the peer record
    liveness_s: float = 10.0  # the job's swarm.heartbeat_s (and AgentConfig.progress_every_s): progress
    watch_s: float = 30.0  # AgentConfig.watch_every_s (news wakes it sooner)
    view_s: float = 30.0  # AgentConfig.view_every_s
    view_per_peer_s: float = 8.0  # AgentConfig.view_per_peer_s
    view_in_plan_s: float = 90.0  # AgentConfig.view_in_plan_s: the peer list's floor while in a plan
    links_ttl_s: float = 480.0  # SwarmConfig.links_ttl_s: a link row's lifetime (republished at half)
    coordinator_watch_s: float = 10.0  # CoordinatorConfig.watch_every_s (the job's heartbeat_s when shorter)
    coordinator_peers_s: float = 30.0  # CoordinatorConfig.peers_every_s
    coordinator_full_s: float = 60.0  # CoordinatorConfig.full_read_every_s: every peer's own progress record
    idle_connection_s: float = 60.0  # SwarmConfig.idle_connection_s: a connection unused this long closes (0: never)


@dataclass(frozen=True)
class DHTCosts:
    """hivemind's bytes per operation (fitted on loopback: ~1.1 KB per RPC exchange, 5 replicas)."""

    rpc: float = 1100.0
    lookup: float = 1.0
    replicas: int = 5
    liveness_replicas: int = 5  # SwarmConfig.liveness_replicas
    progress_replicas: int = 3  # SwarmConfig.progress_replicas
    beam: int = 5
    peer_record: float = 1300.0
    progress_record: float = 1300.0
    link_row: float = 600.0  # plus ~60 bytes per measured link
    job_record: float = 2500.0
    plan_record_per_peer: float = 250.0
    digest_record: float = 900.0  # a region digest's own fields, owner key and signature
    digest_line: float = 170.0  # one member's line of it (its peer id and progress, msgpack)
    find_answer: float = 1200.0  # one node's answer to a lookup: up to 20 nearest nodes' ids and addresses
    connection_s: float = 7.5  # one open libp2p connection's keep-alives and upkeep, per end (fitted: 8 -> 32 peers)

    def store(self, v: float, replicas: int | None = None, peers: int | None = None) -> float:
        """A write to ``replicas`` of a key's nearest nodes; in a swarm of ``peers`` the writer is one of them
        with probability ``replicas / peers`` and keeps that copy itself (no bytes)."""
        r = self.replicas if replicas is None else replicas
        return (r - (local(r, peers) if peers else 0.0)) * (self.rpc + v)

    @staticmethod
    def relookup_period_s(peers: int) -> float:
        """How often a written key's replicas are looked up again (seconds)."""
        return max(300.0, 10.0 * peers)

    def relookup_per_s(self, peers: int) -> float:
        """A written key's replica lookup, amortised over its refresh period (bytes per second)."""
        return self.beam * (self.rpc + self.find_answer) / self.relookup_period_s(peers)

    def read(self, records: float, size: float, *, thorough: bool = False, replicas: int | None = None,
             peers: int | None = None) -> float:
        """A read; a quick one from a node that is itself one of the key's ``replicas`` (probability
        ``replicas / peers``) is answered from its own storage (no bytes)."""
        k = self.beam if thorough else 1
        cost = (self.lookup + k) * self.rpc + k * records * size
        if thorough or not peers:
            return cost
        return cost * (1.0 - local(self.replicas if replicas is None else replicas, peers))


def local(replicas: int, peers: int) -> float:
    """The chance that a node is one of a key's ``replicas`` nearest among ``peers`` nodes."""
    return min(1.0, replicas / max(1, peers))


def connections_per_node(peers: int, contacts: list[tuple[float, float]], idle_s: float) -> float:
    """The libp2p connections a node keeps open, from what it talks to.

    ``contacts``: ``(nodes, period_s)`` of each periodic operation of a peer (a write to 5 replicas every 30 s
    is ``(5, 30)``). The record kinds are shared keys, so every peer talks to the same replicas: within the
    window a connection survives (``idle_s`` plus half the closing loop's period; forever when 0) the nodes
    talked to are a set ``R`` of ``N x (1 - prod(1 - nodes x min(1, window / period) / N))`` nodes. A node in
    ``R`` is connected to every peer, one outside it to ``R``: ``2R - R^2 / N`` connections on average, at
    most ``N - 1``. Flat in N once ``N`` is well past ``R``; without closing, ``R`` is every node any
    operation ever touched (a full mesh in a swarm of a few dozen, as measured)."""
    n = max(1, peers)
    if n == 1:
        return 0.0
    window = float("inf") if idle_s <= 0 else idle_s + min(30.0, idle_s / 4) / 2
    missed = 1.0
    for nodes, period in contacts:
        missed *= 1.0 - min(1.0, min(nodes, n) / n * min(1.0, window / period))
    r = n * (1.0 - missed)
    return min(n - 1.0, 2.0 * r - r * r / n)


def control_plane_cost(
    peers: int, *, regions: int = 1, round_s: float | None = None, training: bool = True,
    cadence: Cadence | None = None, costs: DHTCosts | None = None,
) -> dict[str, Any]:
    """Bytes per peer per second of the control plane for a swarm of ``peers`` (see the module docstring).

    ``round_s``: seconds per DiLoCo round while training (None: no round-driven writes). Returns
    ``bytes_per_peer_s`` (DHT bytes of every node, the coordinator's included, over ``peers``),
    ``peer_bytes_s`` (a peer's own operations), ``coordinator_bytes_s``, ``coordinator_reads_per_min``
    and the inputs.
    """
    c, d = cadence or Cadence(), costs or DHTCosts()
    n = max(1, peers)
    targets = min(n - 1, 3 + 2 * max(0, regions - 1))
    view_period = max(c.view_s, c.view_per_peer_s * n)
    view = (d.read(n, d.peer_record, replicas=d.liveness_replicas, peers=n)
            / (max(view_period, c.view_in_plan_s) if training else view_period))
    row = d.link_row + 60.0 * targets
    links = d.store(row, peers=n) / (c.links_ttl_s / 2) + d.relookup_per_s(n)
    jobs = d.read(1, d.job_record, peers=n) / c.watch_s
    relookups = d.relookup_per_s(n)
    peer = d.store(d.peer_record, d.liveness_replicas, n) / c.heartbeat_s + relookups + view + links + jobs
    relookup_s = d.relookup_period_s(n)
    contacts = [(d.liveness_replicas, c.heartbeat_s), (d.lookup + 1, c.watch_s),
                (d.lookup + 1, max(view_period, c.view_in_plan_s) if training else view_period),
                (d.replicas, c.links_ttl_s / 2), (2 * d.beam, relookup_s)]
    if not training:
        coordinator, reads = 0.0, 0.0
    else:
        per_round = 0.0 if not round_s else 1.0 / round_s
        peer += d.store(d.progress_record, d.progress_replicas, n) * (1.0 / c.liveness_s + per_round)
        peer += d.relookup_per_s(n)
        contacts += [(d.progress_replicas, c.liveness_s), (d.beam, relookup_s)]
        # each region's collector writes its digest every liveness period (one writer per region)
        k = max(1, min(regions, n))
        digest = d.digest_record + d.digest_line * n / k
        peer += k * d.store(digest, d.progress_replicas, n) / c.liveness_s / n
        # the digests every watch (sooner only on news), every record every coordinator_full_s
        full_s = max(c.coordinator_full_s, c.coordinator_watch_s)
        peers_s = max(c.coordinator_peers_s, full_s)
        reads = 60.0 / c.coordinator_watch_s + 60.0 / full_s + 60.0 / peers_s
        coordinator = (d.read(k, digest, replicas=d.progress_replicas, peers=n) / c.coordinator_watch_s
                       + d.read(n, d.progress_record, replicas=d.progress_replicas, peers=n) / full_s
                       + d.read(n, d.peer_record, replicas=d.liveness_replicas, peers=n) / peers_s
                       + d.store(d.plan_record_per_peer * n, peers=n) * per_round)
    connections = connections_per_node(n, contacts, c.idle_connection_s)
    peer += connections * d.connection_s
    return {
        "peers": n, "training": training, "round_s": round_s,
        "bytes_per_peer_s": peer + coordinator / n,
        "peer_bytes_s": peer, "coordinator_bytes_s": coordinator, "coordinator_reads_per_min": reads,
        "connections_per_node": connections,
        "cadence": asdict(c),
    }
