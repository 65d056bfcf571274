"""The reachability preflight: can other machines dial this peer?

Words: a peer is **reachable** when another peer, on another machine, can open
a TCP connection to the endpoint it advertises. A peer behind a home router or
a lab firewall usually is not; a cloud VM is only once its security group
opens the ports.

How it is checked (at join, before the peer record is first published): the
peer asks up to ``helpers`` live peers (or a job's coordinator) over the data
plane, ``reach.dialback``, to dial back each address it advertises: its
data-plane endpoints and its DHT multiaddrs. A helper tries a plain TCP
connection (then closes it) to each target it is willing to dial, and answers
which ones connected.

A helper dials a target only if its host is the address the request came from
(as TCP saw it), a global (public) address, or, for a request from this
machine's loopback, one of this machine's own addresses. A private or loopback address
the requester does not connect from is never dialled: seeing the request come
from elsewhere already says the peer is behind NAT, and a helper must not
probe other hosts of someone's private network for a stranger. The reply
names the address the request came from, which is what a user behind 1:1 NAT
should ``--announce``.

What a verdict means: ``True``: the primary data-plane endpoint was dialled
back; ``False``: it could not be (the peer then dials out instead:
:meth:`~geotrain.transport.Transport.set_dial_out`); ``None``: no helper
answered (the first peer of a swarm), checked again later.

:func:`plannable_peers` is what the coordinator plans on: a peer others cannot
dial either dials out (``dialback://``) or takes no part; :func:`assign_relay`
names the reachable plan peer through which two dial-out peers reach each other.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
import statistics
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from geotrain.errors import ConfigError, GeotrainError, TransportError
from geotrain.plan import StageSlot
from geotrain.swarm.records import PeerRecord
from geotrain.transport import Message, Transport
from geotrain.transport.addresses import (
    DIAL_BACK,
    interface_addresses,
    is_loopback,
    split_endpoint,
    tcp_endpoint,
)

logger = logging.getLogger(__name__)

DIALBACK = "reach.dialback"


@dataclass(frozen=True, kw_only=True)
class ReachabilityConfig:
    """``helpers``: peers asked (each answer counts); ``dial_timeout_s``: per target, on the helper;
    ``request_timeout_s``: per helper; ``max_targets``: what a helper dials for one request;
    ``recheck_s``: how often an unknown verdict is checked again."""

    helpers: int = 2
    dial_timeout_s: float = 2.0
    request_timeout_s: float = 15.0
    max_targets: int = 8
    recheck_s: float = 15.0

    def __post_init__(self) -> None:
        if self.helpers < 1 or self.max_targets < 1:
            raise ConfigError("reachability.helpers and reachability.max_targets must be >= 1")
        for name in ("dial_timeout_s", "request_timeout_s", "recheck_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"reachability.{name} must be > 0; got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class Reachability:
    """The preflight's result. ``data_plane``/``dht``: target -> dialled back (by any helper);
    ``seen_from``: the address helpers saw the requests come from."""

    reachable: bool | None
    data_plane: dict[str, bool] = field(default_factory=dict)
    dht: dict[str, bool] = field(default_factory=dict)
    checked_by: tuple[str, ...] = ()
    seen_from: tuple[str, ...] = ()

    @property
    def dht_reachable(self) -> bool | None:
        if not self.checked_by or not self.dht:
            return None
        return any(self.dht.values())

    def fix(self, *, dht_port: int, data_port: int) -> str:
        """The likely fix, in one sentence (empty when reachable or unknown)."""
        if self.reachable is not False and self.dht_reachable is not False:
            return ""
        seen = ", ".join(self.seen_from)
        hints = []
        announced = [split_endpoint(e)[0] for e in self.data_plane]
        if self.seen_from and not set(self.seen_from) & set(announced):
            hints.append(f"other peers see this machine as {seen}: if that address forwards to it (1:1 NAT, "
                         f"e.g. a cloud VM's public IP), run with --announce {self.seen_from[0]}")
        hints.append(f"open inbound TCP {data_port} (data plane) and {dht_port} (DHT) in the firewall or "
                     "security group, with fixed ports (--port, --dht-port)")
        hints.append("or, behind a home router or lab NAT, run with --nat (this peer dials out to the others)")
        return "; ".join(hints)


def serve_dialback(transport: Transport, config: ReachabilityConfig | None = None) -> None:
    """Answer other peers' ``reach.dialback`` requests on this transport."""
    cfg = config or ReachabilityConfig()

    def handle(msg: Message, origin: str | None) -> Message:
        targets = msg.meta.get("targets")
        if not isinstance(targets, list):
            return Message(DIALBACK + ".ok", meta={"error": "targets must be a list", "seen_from": origin})
        ok: dict[str, bool] = {}
        for t in targets[: cfg.max_targets]:
            if not isinstance(t, str):
                continue
            try:
                host, port = split_endpoint(t)
            except ConfigError:
                continue
            if not may_dial(host, origin):
                ok[t] = False
                continue
            ok[t] = _tcp_connects(host, port, cfg.dial_timeout_s)
        return Message(DIALBACK + ".ok", meta={"ok": ok, "seen_from": origin})

    transport.serve_with_origin(DIALBACK, handle)


def may_dial(host: str, origin: str | None) -> bool:
    """A helper dials a target host only if the request came from it, or it is a global address."""
    host = host.strip("[]")
    if origin is not None and _same_address(host, origin):
        return True
    if origin is not None and is_loopback(origin) and host in interface_addresses():
        return True  # a request from this machine, for one of this machine's own addresses
    try:
        return ipaddress.ip_address(host).is_global
    except ValueError:
        return False  # a name: it could resolve anywhere, so it is not dialled for a stranger


def _same_address(a: str, b: str) -> bool:
    try:
        ia, ib = ipaddress.ip_address(a), ipaddress.ip_address(b.strip("[]"))
    except ValueError:
        return False
    if isinstance(ib, ipaddress.IPv6Address) and ib.ipv4_mapped is not None:
        ib = ib.ipv4_mapped
    return ia == ib


def _tcp_connects(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _maddr_target(maddr: str) -> str | None:
    """``/ip4/H/tcp/P/...`` -> ``tcp://H:P`` (None for anything else, e.g. a relay address)."""
    parts = maddr.split("/")
    if len(parts) >= 5 and parts[1] in ("ip4", "ip6") and parts[3] == "tcp" and "p2p-circuit" not in maddr:
        return tcp_endpoint(parts[2], int(parts[4]))
    return None


def helpers_for(peers: Mapping[str, PeerRecord], *, me: str, region: str, count: int) -> list[PeerRecord]:
    """Peers to ask: dialable ones other than ``me``, other regions first (another network is a truer test)."""
    ok = [r for pid, r in peers.items() if pid != me and not r.dial_back and r.reachable is not False]
    ok.sort(key=lambda r: (r.region == region, r.reachable is not True, -r.heartbeat_at, r.peer_id))
    return ok[:count]


def preflight(
    transport: Transport,
    *,
    helpers: list[tuple[str, str, str | None]],
    dht_maddrs: list[str] = (),  # type: ignore[assignment]
    config: ReachabilityConfig | None = None,
) -> Reachability:
    """Ask ``helpers`` ((peer id, endpoint, CURVE key or None)) to dial this peer back, all at once.

    Returns once ``config.helpers`` answered (the first in ``helpers`` order count) or every one
    answered or timed out. Sets ``transport.reachable`` to the verdict.
    """
    cfg = config or ReachabilityConfig()
    data_targets = list(transport.endpoints)
    dht_targets = [t for t in (_maddr_target(m) for m in dht_maddrs) if t is not None]
    data: dict[str, bool] = dict.fromkeys(data_targets, False)
    dht: dict[str, bool] = dict.fromkeys(dht_targets, False)
    targets = (data_targets + dht_targets)[: cfg.max_targets]
    # every helper is asked at once: one that does not answer (gone, or a closed swarm's member refusing an
    # outsider) costs request_timeout_s in parallel, not in turn, before the next one is asked
    replies: dict[str, Message] = {}
    done = threading.Condition()
    finished = [0]

    def ask(peer_id: str, endpoint: str, key: str | None) -> None:
        try:
            transport.connect(peer_id, endpoint, curve_server_key=key.encode() if key else None)
            reply = transport.request(peer_id, Message(DIALBACK, meta={"targets": targets}),
                                      timeout=cfg.request_timeout_s)
        except TransportError as e:  # PeerTimeoutError included
            logger.info("reachability helper %s did not answer: %s", peer_id, e)
            reply = None
        with done:
            if reply is not None and isinstance(reply.meta.get("ok"), dict):
                replies[peer_id] = reply
            finished[0] += 1
            done.notify_all()

    for peer_id, endpoint, key in helpers:
        threading.Thread(target=ask, args=(peer_id, endpoint, key), name="gt-reach-ask", daemon=True).start()
    with done:
        done.wait_for(lambda: len(replies) >= cfg.helpers or finished[0] >= len(helpers),
                      timeout=cfg.request_timeout_s + 5.0)
        answered = [(pid, replies[pid]) for pid, _, _ in helpers if pid in replies][: cfg.helpers]
    checked: list[str] = []
    seen: list[str] = []
    for peer_id, reply in answered:
        ok = reply.meta["ok"]
        checked.append(peer_id)
        origin = reply.meta.get("seen_from")
        if isinstance(origin, str) and origin not in seen:
            seen.append(origin)
        for t, v in ok.items():
            if v is True and t in data:
                data[t] = True
            if v is True and t in dht:
                dht[t] = True
    verdict: bool | None = None
    if checked:
        primary = data_targets[0] if data_targets else None
        verdict = bool(primary is not None and data.get(primary))
    result = Reachability(reachable=verdict, data_plane=data, dht=dht, checked_by=tuple(checked),
                          seen_from=tuple(seen))
    transport.reachable = verdict if not transport.dial_out else False
    return result


def swarm_helpers(swarm: Any, *, region: str, count: int) -> list[tuple[str, str, str | None]]:
    """Helpers from the live swarm: peers (see :func:`helpers_for`), then the jobs' coordinators.

    A peer without the swarm key asks no member of a closed swarm (a record with an admission proof): its
    data plane refuses the connection, so the question would only cost ``request_timeout_s``; a warning says
    why nobody was asked.
    """
    keyless = getattr(swarm, "admission", None) is None
    peers = swarm.get_peers()
    closed = sorted(pid for pid, r in peers.items() if keyless and r.admission and pid != swarm.peer_id)
    out = [(r.peer_id, r.endpoint, r.curve_public_key)
           for r in helpers_for({p: r for p, r in peers.items() if p not in closed}, me=swarm.peer_id,
                                region=region, count=count)]
    for owner, job in sorted(swarm.get_jobs().items()):
        if keyless and job.admission:
            continue
        if owner != swarm.peer_id and job.endpoint and job.endpoint.startswith("tcp://"):
            out.append((owner, job.endpoint, job.curve_public_key))
    if closed and not out:
        logger.warning("the %d peers of this swarm are members of a closed swarm (their records carry swarm-key "
                       "proofs): they refuse peers without the key, so none will train with this one; start it "
                       "with --swarm-key FILE (the swarm's key, made by `geotrain keygen FILE`)",
                       len(closed))
    return out


def reachability_event(result: Reachability, *, transport: Transport, dht_port: int, dht_maddrs: list[str],
                       client_mode: bool) -> dict[str, Any]:
    """The JSON line ``geotrain peer`` prints: what must be reachable from where, and what was found."""
    _, data_port = split_endpoint(transport.bound_address)
    event: dict[str, Any] = {
        "event": "reachability",
        "reachable": result.reachable if not transport.dial_out else False,
        "dial_out": transport.dial_out,
        "data_plane": {
            "protocol": "tcp", "port": data_port, "bound": transport.bound_address,
            "advertised": list(transport.endpoints), "dialled_back": result.data_plane,
            "from": "every peer this one exchanges with (pipeline neighbours, stage group, coordinator)"
            if not transport.dial_out else "nowhere: this peer dials out to the others",
        },
        "dht": {
            "protocol": "tcp", "port": dht_port, "advertised": dht_maddrs, "dialled_back": result.dht,
            "from": "every DHT node of the swarm (peers, coordinator, bootstrap)"
            if not client_mode else "nowhere: client mode, this node dials out to the DHT",
        },
        "checked_by": list(result.checked_by),
        "seen_from": list(result.seen_from),
    }
    fix = result.fix(dht_port=dht_port, data_port=data_port)
    if fix:
        event["fix"] = fix
    return event


def run_preflight(
    transport: Transport,
    swarm: Any,
    *,
    region: str,
    config: ReachabilityConfig | None = None,
    auto_dial_out: bool = True,
) -> Reachability:
    """The join-time check of ``geotrain peer``: ask the swarm, log the verdict loudly, and switch
    to dial-out when this peer turns out unreachable (``auto_dial_out``)."""
    cfg = config or ReachabilityConfig()
    maddrs = [m for m in swarm.visible_maddrs() if not is_loopback(m.split("/")[2])] or swarm.visible_maddrs()
    try:
        helpers = swarm_helpers(swarm, region=region, count=cfg.helpers + 2)
    except GeotrainError as e:  # the DHT read failed: unknown for now, checked again later
        logger.info("reachability: cannot list peers to ask: %s", e)
        helpers = []
    result = preflight(transport, helpers=helpers, dht_maddrs=maddrs, config=cfg)
    _, data_port = split_endpoint(transport.bound_address)
    dht_port = int(maddrs[0].split("/")[4]) if maddrs else 0
    if result.reachable is False and not transport.dial_out:
        logger.warning(
            "THIS PEER IS NOT REACHABLE: %s could not dial %s back (they see it as %s). Fix: %s. Until then it "
            "dials out to the peers it exchanges with.",
            ", ".join(result.checked_by), transport.address, ", ".join(result.seen_from) or "?",
            result.fix(dht_port=dht_port, data_port=data_port),
        )
        if auto_dial_out:
            transport.set_dial_out(True)
    elif result.dht_reachable is False and not swarm.config.client_mode:
        logger.warning("this peer's DHT port %s is not reachable from %s; fix: %s", dht_port,
                       ", ".join(result.checked_by), result.fix(dht_port=dht_port, data_port=data_port))
    elif result.reachable is None:
        logger.info("reachability unknown: no other peer to dial this one back yet; checked again later")
    else:
        logger.info("reachable: %s dialled %s back", ", ".join(result.checked_by), transport.address)
    return result


class ReachabilityMonitor:
    """Re-runs the preflight while the verdict is unknown (after 2 s, then every ``recheck_s``; until :meth:`stop`)."""

    def __init__(self, transport: Transport, swarm: Any, *, region: str, config: ReachabilityConfig | None = None,
                 on_result: Callable[[Reachability], None] | None = None) -> None:
        self.transport, self.swarm, self.region = transport, swarm, region
        self.config = config or ReachabilityConfig()
        self._on_result = on_result or (lambda r: None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gt-reach", daemon=True)

    def start(self) -> ReachabilityMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        # the first re-check comes soon: in a closed swarm no helper admits this peer's CURVE key before its
        # record is published, so the join-time check finds nobody and the verdict waits for this one
        wait = min(2.0, self.config.recheck_s)
        while self.transport.reachable is None and not self._stop.wait(wait):
            wait = self.config.recheck_s
            try:
                result = run_preflight(self.transport, self.swarm, region=self.region, config=self.config)
            except Exception as e:  # a DHT hiccup: the next check tries again
                logger.info("reachability re-check failed: %s", e)
                continue
            if result.reachable is not None:
                self._on_result(result)


def plannable_peers(peers: Mapping[str, PeerRecord], *, relays: bool = True) -> dict[str, PeerRecord]:
    """The peers a plan may use, given who can dial whom.

    A reachable (or not yet checked) peer: always. A peer that cannot be dialled and does not dial
    out: never (nobody could send to it). A dial-out (``dialback://``) peer talks only over
    connections it opened, so two of them reach each other only through a relay
    (:func:`assign_relay`): with ``relays`` and at least one dialable peer, every dial-out peer is
    plannable; otherwise a plan takes at most one (the fastest; ties: lowest peer id), as every
    peer of a plan may have to talk to every other (neighbours, the tied first/last stage, stage
    groups, state donors). The others wait as spares.
    """
    out = {pid: r for pid, r in peers.items() if not r.dial_back and r.reachable is not False}
    nat = sorted((r for r in peers.values() if r.dial_back), key=lambda r: (-r.flops, r.peer_id))
    keep = nat if relays and out else nat[:1]
    for r in keep:
        out[r.peer_id] = r
    for r in nat[len(keep):]:
        logger.info("left %s out of the plan: it is behind NAT like %s, and no reachable peer can relay "
                    "between them", r.peer_id, nat[0].peer_id)
    return dict(sorted(out.items()))


def measured_directions(
    peers: Mapping[str, PeerRecord], links: Mapping[str, Any]
) -> Iterator[tuple[str, str, tuple[float, float]]]:
    """Each usable measurement in the link rows: ``(src, dst, (bytes/s, RTT s))`` between two of ``peers``
    (the prober's bulk transfer went src -> dst); rows of unknown peers, self-links and zero bandwidths are
    left out."""
    for row in links.values():
        if row.src not in peers:
            continue
        for dst, m in row.links.items():
            if dst in peers and dst != row.src and m.bandwidth_bps > 0:
                yield row.src, dst, (m.bandwidth_bps, m.rtt_s)


def _legs(peers: Mapping[str, PeerRecord], links: Mapping[str, Any]) -> Callable[[str, str], tuple[float, float] | None]:
    """What one leg ``a``-``b`` costs, (bytes/s, RTT s): the pair's own measurement (either direction; the
    slower), else its regions' figure (the median of every measured pair between them, as the planner
    prices an unmeasured pair), else None.

    A peer probes only a few peers of each region (``probe_targets``), so in a large swarm no dialable peer
    need be measured by every dial-out peer, and a probe that failed under load leaves a leg unmeasured.
    """
    pairs: dict[frozenset[str], list[tuple[float, float]]] = {}
    regions: dict[frozenset[str], list[tuple[float, float]]] = {}
    for src, dst, figure in measured_directions(peers, links):
        pairs.setdefault(frozenset((src, dst)), []).append(figure)
        regions.setdefault(frozenset((peers[src].region, peers[dst].region)), []).append(figure)

    def leg(a: str, b: str) -> tuple[float, float] | None:
        if found := pairs.get(frozenset((a, b))):
            return min(f[0] for f in found), max(f[1] for f in found)
        if est := regions.get(frozenset((peers[a].region, peers[b].region))):
            return statistics.median(f[0] for f in est), statistics.median(f[1] for f in est)
        return None

    return leg


def relay_candidate(peers: Mapping[str, PeerRecord], links: Mapping[str, Any]) -> str | None:
    """The dialable peer that best relays between the dial-out peers: the one whose slowest link to them
    (:func:`_legs`: measured, else its regions' figure, else 0) is fastest (ties: lowest peer id). None
    without one."""
    return _relay(peers, _legs(peers, links))


def _relay(peers: Mapping[str, PeerRecord], leg: Callable[[str, str], tuple[float, float] | None]) -> str | None:
    """:func:`relay_candidate` on legs already priced."""
    nat = [p for p, r in peers.items() if r.dial_back]
    dialable = [p for p, r in peers.items() if not r.dial_back and r.reachable is not False]
    if len(nat) < 2 or not dialable:
        return None

    def bw(a: str, b: str) -> float:
        figure = leg(a, b)
        return 0.0 if figure is None else figure[0]

    return min(dialable, key=lambda r: (-min(bw(r, n) for n in nat), r))


def relayed_links(peers: Mapping[str, PeerRecord], links: Mapping[str, Any]) -> dict[tuple[str, str], tuple[float, float]]:
    """What two dial-out peers' link costs through :func:`relay_candidate`: (bytes/s, RTT s) per pair
    ``(a, b)`` with ``a < b``, for pairs with no measurement of their own (they cannot measure it).

    The relayed hop is priced as two: bandwidth = the slower of the two legs, RTT = their sum. A leg
    nobody measured is priced by its regions' figure (:func:`_legs`); pairs with a leg that has neither
    are left out (the planner places no hop there).
    """
    leg = _legs(peers, links)  # priced once, for the choice of relay and its hops
    relay = _relay(peers, leg)
    if relay is None:
        return {}
    nat = sorted(p for p, r in peers.items() if r.dial_back)
    out = {}
    for i, a in enumerate(nat):
        for b in nat[i + 1:]:
            la, lb = leg(a, relay), leg(relay, b)
            if la is not None and lb is not None:
                out[(a, b)] = (min(la[0], lb[0]), la[1] + lb[1])
    return out


def assign_relay(pipelines: list[list[StageSlot]], *, prefer: str | None = None) -> list[list[StageSlot]]:
    """With two or more dial-out peers in a plan, route them to each other through one reachable
    plan peer: their slots' endpoints become ``dialback://<relay id>``.

    The relay is ``prefer`` (:func:`relay_candidate`, the peer the links were priced through) when
    it is in the plan, else the reachable plan peer sharing a region with the most dial-out peers
    (ties: lowest peer id). Everyone else still reaches a dial-out peer over that peer's own
    connection. Without a reachable plan peer nothing changes.
    """
    slots = [s for pipe in pipelines for s in pipe]
    nat = {s.peer: s for s in slots if s.endpoint.startswith(DIAL_BACK)}
    if len(nat) < 2:
        return pipelines
    dialable = sorted({s.peer: s for s in slots if s.endpoint.startswith("tcp://")}.values(),
                      key=lambda s: (s.peer != prefer, -sum(n.region == s.region for n in nat.values()), s.peer))
    if not dialable:
        logger.warning("plan has %d peers behind NAT and no reachable peer to relay between them", len(nat))
        return pipelines
    relay = dialable[0].peer
    return [[dataclasses.replace(s, endpoint=f"{DIAL_BACK}{relay}") if s.peer in nat else s for s in pipe]
            for pipe in pipelines]
