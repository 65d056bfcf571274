"""The :class:`Swarm` facade: one peer's handle on the swarm's DHT.

What is a swarm? The peers that share one DHT and one swarm name. The name
prefixes every DHT key geotrain uses, so several swarms can share one DHT (and
one plain ``hivemind-dht`` bootstrap) without seeing each other's records.

A :class:`Swarm` starts a hivemind DHT node (in a child process, with its
``p2pd``), installs geotrain's validators and the msgpack decode guard, and
publishes / reads the typed records of :mod:`geotrain.swarm.records`. Every
DHT call has a deadline (:class:`~geotrain.errors.DHTTimeoutError` past it).
Reads return only live records that pass validation, keyed by owner peer id.
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from geotrain.errors import BootstrapError, ConfigError, DHTTimeoutError, RecordError, SwarmError
from geotrain.swarm.identity import Identity, peer_id_from_public_key
from geotrain.swarm.msgpack_guard import install_decode_guard, scan_msgpack
from geotrain.swarm.records import (
    JobRecord,
    LinkRow,
    PeerRecord,
    PlanRecord,
    ProgressRecord,
    RegionDigest,
    _Record,
)
from geotrain.swarm.schema import build_validators, dht_key

if TYPE_CHECKING:
    from geotrain.swarm.admission import Admission
    from geotrain.swarm.dht_process import SwarmDHT
    from geotrain.swarm.heartbeat import Heartbeat

logger = logging.getLogger(__name__)
_ops_log = logging.getLogger("geotrain.swarm.ops")  # one DEBUG line per DHT read and write (what the control plane does)
R = TypeVar("R", bound=_Record)

_SWARM_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_OWNER_RE = re.compile(rb"\[owner:(.+?)\]")


@dataclass(frozen=True, kw_only=True)
class SwarmConfig:
    """How one peer joins the swarm's DHT.

    ``initial_peers``: multiaddrs ending in ``/p2p/<peer id>`` (empty = start a new swarm).
    ``host``/``port``: where this node's libp2p listens (port 0 = any free port).
    ``announce``: the addresses other nodes should dial, ``HOST`` or ``HOST:PORT``
    (hivemind's ``announce_maddrs``); an item without a port needs a fixed ``port``.
    Empty: the listening address, or with ``host`` 0.0.0.0/:: and a fixed port this
    machine's interface addresses (non-loopback first); never an unspecified address.
    ``client_mode``: a node that accepts no inbound connections (behind NAT): it
    reads and writes the DHT through others but stores nothing and serves no one.
    ``use_relay``: may use libp2p circuit relays to reach NATed nodes;
    ``use_auto_relay``: finds relays on its own and is reachable through them.
    ``heartbeat_s``: period of the peer-record heartbeat; the record expires after 3 periods and one
    ``rpc_timeout_s`` (:meth:`liveness_ttl_s`).
    ``record_ttl_s``: lifetime of link/job/plan/progress records (republish before it ends).
    ``max_ttl_s``/``max_value_bytes``/``max_depth``: what this node's validators accept.
    ``timeout_s``: deadline of each get/store; ``rpc_timeout_s``: of one hivemind RPC.
    ``read_beam``: how many of a key's nearest nodes a thorough read asks (hivemind's default,
    the bucket size of 20, asks every node of a small swarm each time); records are stored on
    hivemind's 5 nearest nodes, and a thorough read merges the dictionaries it gets. A quick
    read (``thorough=False``) takes the first replica's copy: one O(N) answer instead of
    ``read_beam``, for readers that tolerate missing a record now and then.
    ``liveness_replicas``: how many of its key's nearest nodes keep the peer record, whose absence means
    "gone" (the others: 5, hivemind's ``num_replicas``). It is rewritten every period and expires after 3
    (:meth:`liveness_ttl_s`); each copy is one RPC, ~1.1 KB on the wire besides the record. The default
    stays 5: with 3, a closed swarm's two same-region members sometimes never measured the link between
    them, so no plan was possible (tests/coordinator/test_admission.py: 3 failures in 6 runs with 3, none in
    4 with 5; the likely cause, not proven: a peer's quick read of the peer list that stops at a node outside
    the 3, holding an older, partial copy from when the swarm was smaller, misses peers).
    ``progress_replicas``: the same for the progress record, a job's liveness signal, rewritten every
    liveness period by every peer of a job: most of a training peer's DHT bytes. Only the coordinator reads
    it, and a plan peer its quick read misses is looked for on every replica before it counts as gone, so a
    partial copy costs a thorough read, never a false death: 3.
    ``links_ttl_s``: lifetime of a peer's row of link figures, or ``max_ttl_s`` when that is shorter
    (:attr:`links_lifetime_s`; the row is republished at half of it). Links are measured hourly and read
    when a plan is made; a dead peer's row is ignored with its peer record.
    ``idle_connection_s``: a libp2p connection this node's DHT has not used for this long is closed (0: never;
    the initial peers' stay open, and a node with ``use_auto_relay`` closes none: its relays are how it is
    reached). libp2p keeps every connection open otherwise, and each unused one
    costs ~20-40 B/s of keep-alives; a swarm of a few dozen nodes ends up fully connected. The default of
    60 s keeps the connections a peer uses every heartbeat (30 s); closing one costs a dial later (a few KB,
    about what a minute of keep-alives costs). Measured at N = 32: 60 s halves the connections and saves
    15% of the idle DHT bytes; 300 s keeps 25 of 35 and saves nothing measurable.
    """

    initial_peers: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 0
    swarm: str = "geotrain"
    announce: tuple[str, ...] = ()
    client_mode: bool = False
    use_relay: bool = True
    use_auto_relay: bool = False
    heartbeat_s: float = 5.0
    record_ttl_s: float = 120.0
    max_ttl_s: float = 600.0
    max_value_bytes: int = 512 * 1024
    max_depth: int = 24
    timeout_s: float = 10.0
    rpc_timeout_s: float = 3.0
    start_timeout_s: float = 60.0
    read_beam: int = 5
    liveness_replicas: int = 5
    progress_replicas: int = 3
    links_ttl_s: float = 480.0
    idle_connection_s: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.initial_peers, (str, bytes)) or not all(
            isinstance(p, str) for p in self.initial_peers
        ):
            raise ConfigError(
                "swarm.initial_peers must be a tuple of multiaddr strings, e.g. ('/ip4/1.2.3.4/tcp/31337/p2p/Qm...',)"
            )
        for maddr in self.initial_peers:
            if "/p2p/" not in maddr:
                raise ConfigError(
                    f"initial peer {maddr!r} must end with /p2p/<peer id>; copy it from the bootstrap's ready line"
                )
        if not _SWARM_NAME_RE.match(self.swarm):
            raise ConfigError(
                f"swarm name {self.swarm!r} must be a letter then up to 63 letters, digits or '_'"
            )
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"swarm.port must be in 0..65535 (0 = any free port); got {self.port}")
        if not self.host:
            raise ConfigError("swarm.host must be an address such as 127.0.0.1 or 0.0.0.0")
        if isinstance(self.announce, str):
            raise ConfigError("swarm.announce must be a tuple of HOST or HOST:PORT strings")
        from geotrain.transport.addresses import announce_host_port, parse_announce

        parse_announce(",".join(self.announce))  # refuses unspecified and malformed items
        if self.port == 0 and any(announce_host_port(a, 0)[1] == 0 for a in self.announce):
            raise ConfigError(
                "an announced DHT address must name its port: give a fixed DHT port (--dht-port; --port for "
                "geotrain dht), the port others dial and your firewall must open"
            )
        for name in (
            "heartbeat_s",
            "record_ttl_s",
            "max_ttl_s",
            "timeout_s",
            "rpc_timeout_s",
            "start_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"swarm.{name} must be > 0; got {getattr(self, name)}")
        if not 1 <= self.read_beam <= 64:
            raise ConfigError(f"swarm.read_beam must be in 1..64; got {self.read_beam}")
        for name in ("liveness_replicas", "progress_replicas"):
            if not 1 <= getattr(self, name) <= min(5, self.read_beam):
                # hivemind's nodes keep 5 replicas at most; beyond read_beam a thorough read could miss every copy
                raise ConfigError(
                    f"swarm.{name} must be in 1..min(5, read_beam={self.read_beam}); got {getattr(self, name)}"
                )
        if self.peer_ttl_s > self.max_ttl_s:
            raise ConfigError(
                f"swarm.heartbeat_s x 3 + rpc_timeout_s must be <= max_ttl_s ({self.max_ttl_s}); got "
                f"{self.heartbeat_s} and {self.rpc_timeout_s}"
            )
        if self.record_ttl_s > self.max_ttl_s:
            raise ConfigError(
                f"swarm.record_ttl_s must be <= max_ttl_s ({self.max_ttl_s}); got {self.record_ttl_s}"
            )
        if not self.links_ttl_s > 0:
            raise ConfigError(f"swarm.links_ttl_s must be > 0; got {self.links_ttl_s}")
        if not self.idle_connection_s >= 0:
            raise ConfigError(f"swarm.idle_connection_s must be >= 0 (0: never close); got {self.idle_connection_s}")
        if self.max_value_bytes < 4096 or self.max_depth < 4:
            raise ConfigError("swarm.max_value_bytes must be >= 4096 and swarm.max_depth >= 4")

    @property
    def peer_ttl_s(self) -> float:
        """Lifetime of one heartbeat's peer record (see :meth:`liveness_ttl_s`)."""
        return self.liveness_ttl_s(self.heartbeat_s)

    @property
    def links_lifetime_s(self) -> float:
        """Lifetime of a published link row: ``links_ttl_s``, or ``max_ttl_s`` when that is shorter."""
        return min(self.links_ttl_s, self.max_ttl_s)

    def liveness_ttl_s(self, period_s: float) -> float:
        """Lifetime of a record renewed every ``period_s`` whose absence means "gone": 3 periods and one RPC
        timeout. A renewal waits for its replicas; one behind a congested link answers only at the RPC
        timeout, and with 3 periods alone the record it renewed had expired by then: a live peer taken for
        dead (seen when a pipeline saturated the link between two peers' DHT nodes)."""
        return 3 * period_s + self.rpc_timeout_s

    def host_maddr(self) -> str:
        return _maddr(self.host, self.port)

    def announce_maddrs(self) -> list[str]:
        """What this node publishes for other nodes to dial (empty = what libp2p finds by itself)."""
        from geotrain.transport.addresses import announce_host_port, interface_addresses, is_unspecified

        if self.announce:
            return [_maddr(*announce_host_port(a, self.port)) for a in self.announce]
        if is_unspecified(self.host) and self.port:
            import socket

            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            hosts = interface_addresses(family=family)
            logger.info("DHT bound to %s without --announce: announcing %s", self.host, ", ".join(hosts))
            return [_maddr(h, self.port) for h in hosts]
        return []


def _maddr(host: str, port: int) -> str:
    host = host.strip("[]")
    proto = "ip6" if ":" in host else "ip4"
    if proto == "ip4" and not host.replace(".", "").isdigit():
        proto = "dns"
    return f"/{proto}/{host}/tcp/{port}"


class Swarm:
    """One peer's handle on the swarm's DHT. Use as a context manager, or start()/shutdown().

    >>> with Swarm(SwarmConfig(initial_peers=(maddr,)), identity=Identity.load_or_create(path)) as swarm:
    ...     swarm.publish_peer(record)
    ...     peers = swarm.get_peers()        # {peer_id: PeerRecord}, live and valid only
    """

    def __init__(
        self, config: SwarmConfig, *, identity: Identity | None = None, admission: Admission | None = None
    ) -> None:
        self.config = config
        #: with a swarm key: records of owners without a valid admission proof are ignored
        self.admission = admission
        self._members: set[str] = set()
        self._size = 1  # peers in the last read of the peer list (paces the write path's replica lookups)
        self.identity = identity if identity is not None else Identity.ephemeral()
        self._dht: SwarmDHT | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._owner_subkey = b"[owner:" + self.identity.owner_public_key() + b"]"
        self._last_expiration: dict[str, float] = {}
        self._lock = threading.Lock()
        self._heartbeats: list[Heartbeat] = []
        self._p2pd_pid: int | None = None
        self._idle_closer: Any = None  # the DHT process's idle-connection loop (its future)

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def peer_id(self) -> str:
        """This peer's id: its libp2p peer id, derived from its identity key."""
        return self.identity.peer_id

    @property
    def dht_pid(self) -> int | None:
        """Process id of the DHT child (its ``p2pd`` is that process's child); None before start."""
        return None if self._dht is None else self._dht.pid

    @property
    def p2pd_pid(self) -> int | None:
        """Process id of this node's ``p2pd`` daemon; None before start and after shutdown."""
        return self._p2pd_pid

    @property
    def started(self) -> bool:
        return self._dht is not None and self._dht.is_alive()

    def start(self) -> Swarm:
        """Start the DHT node and join the swarm. Raises BootstrapError if no initial peer answers."""
        if self._dht is not None:
            raise SwarmError("this Swarm was already started; make a new one")
        install_decode_guard()  # before the fork: the DHT child inherits it
        from geotrain.swarm.dht_process import SwarmDHT

        cfg = self.config
        identity_path = self.identity.path
        if (
            identity_path is None
        ):  # p2pd reads its key from a file; an ephemeral one lives in a private temp dir
            self._tmpdir = tempfile.TemporaryDirectory(prefix="geotrain-id-")
            identity_path = self.identity.write(Path(self._tmpdir.name) / "identity.key")
        validators = build_validators(
            swarm=cfg.swarm,
            private_key=self.identity.hivemind_private_key(),
            max_value_bytes=cfg.max_value_bytes,
            max_depth=cfg.max_depth,
            max_ttl_s=cfg.max_ttl_s,
        )
        dht = SwarmDHT(
            initial_peers=list(cfg.initial_peers),
            start=False,
            record_validators=validators,
            client_mode=cfg.client_mode,
            host_maddrs=[cfg.host_maddr()],
            announce_maddrs=cfg.announce_maddrs() or None,
            use_relay=cfg.use_relay,
            use_auto_relay=cfg.use_auto_relay,
            identity_path=str(identity_path),
            # the check dials the swarm with a throwaway p2pd to see whether our peer id is already
            # online; a key minted a moment ago cannot be, so skip the extra daemon for those
            check_if_identity_free=self.identity.path is not None,
            wait_timeout=cfg.rpc_timeout_s,
            bootstrap_timeout=cfg.rpc_timeout_s,
            startup_timeout=min(cfg.start_timeout_s, 30.0),
            shutdown_timeout=5.0,
            # Quiet by design: no background re-reads of cached values (every reader polls on its own
            # schedule) and no copy of each found value pushed to a nearer node after every read.
            # A quick read (thorough=False) must come from the swarm, not from this node's copy of an
            # earlier read or of its own last write (hivemind would return that one record as the whole
            # dictionary): nothing is cached locally; this node's own replicas still answer first.
            cache_refresh_before_expiry=0,
            cache_nearest=0,
            cache_locally=False,
            cache_on_store=False,
        )
        self._dht = dht
        try:
            dht.run_in_background(await_ready=True, timeout=cfg.start_timeout_s)
        except TimeoutError as e:
            self.shutdown()
            raise BootstrapError(f"the DHT node did not start within {cfg.start_timeout_s}s") from e
        except Exception as e:
            self.shutdown()
            if "bootstrap failed" in str(e) or cfg.initial_peers:
                raise BootstrapError(
                    f"none of the initial peers answered ({', '.join(cfg.initial_peers)}): {e}. "
                    "Check that the bootstrap is running and the multiaddrs (with /p2p/<id>) are current."
                ) from e
            raise SwarmError(f"the DHT node failed to start: {e}") from e
        from geotrain.swarm.dht_process import p2pd_pid

        # remembered so shutdown() can still stop p2pd if the DHT process dies without cleaning up
        self._p2pd_pid = self._wait(dht.run_coroutine(p2pd_pid, return_future=True), "find p2pd")
        if self._tmpdir is not None:
            # p2pd read the ephemeral key when it started: remove it now, so a process killed later leaves
            # no private key behind in the temp directory
            self._tmpdir.cleanup()
            self._tmpdir = None
        # a node behind NAT that finds relays keeps its relay connections open: they are its reachability
        if cfg.idle_connection_s > 0 and not cfg.use_auto_relay:
            from geotrain.swarm.dht_process import close_idle_connections

            keep = tuple(m.rsplit("/p2p/", 1)[1] for m in cfg.initial_peers)
            # runs in the DHT process until its node stops; the future resolves then
            self._idle_closer = dht.run_coroutine(
                partial(close_idle_connections, idle_s=cfg.idle_connection_s,
                        period_s=min(30.0, cfg.idle_connection_s / 4), keep=keep),
                return_future=True,
            )
        logger.info("joined swarm %r as %s", cfg.swarm, self.peer_id)
        return self

    def shutdown(self) -> None:
        """Stop heartbeats and the DHT node (its p2pd with it). Idempotent."""
        for hb in self._heartbeats:
            hb.stop()
        self._heartbeats.clear()
        if self._dht is not None:
            dht, self._dht = self._dht, None
            if dht.is_alive():
                dht.shutdown()
            if dht.is_alive():
                dht.kill()
            dht.join(timeout=5.0)
        self._idle_closer = None
        if self._p2pd_pid is not None:
            from geotrain.swarm.dht_process import terminate_p2pd

            terminate_p2pd(self._p2pd_pid)  # a no-op unless the DHT process died and left it behind
            self._p2pd_pid = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> Swarm:
        return self.start() if self._dht is None else self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def connections(self) -> dict[str, int]:
        """This node's open libp2p connections (``connected``) and those closed for idleness so far (``closed``)."""
        from geotrain.swarm.dht_process import idle_closer_stats

        return dict(self._wait(self._require().run_coroutine(idle_closer_stats, return_future=True), "connections"))

    def visible_maddrs(self) -> list[str]:
        """Multiaddrs (with ``/p2p/<peer id>``) other peers can use as ``initial_peers``."""
        dht = self._require()
        from hivemind.dht.dht import DHT

        future = dht.run_coroutine(DHT._get_visible_maddrs, return_future=True)
        from geotrain.transport.addresses import is_loopback, is_unspecified

        # libp2p may list the bound wildcard itself; nobody can dial that. Loopback last: it is only for this machine
        maddrs = [str(m) for m in self._wait(future, "get visible maddrs")]
        maddrs = [m for m in maddrs if not is_unspecified(m.split("/")[2])]
        return sorted(maddrs, key=lambda m: is_loopback(m.split("/")[2]))

    # -- publishing ------------------------------------------------------------------------------
    def publish_peer(self, record: PeerRecord) -> bool:
        """Publish this peer's record with expiry :attr:`SwarmConfig.peer_ttl_s` on ``liveness_replicas`` nodes.
        True if a replica took it."""
        self._check_own(record.peer_id, "peer_id")
        return self._publish("peers", record, self.config.peer_ttl_s, replicas=self.config.liveness_replicas)

    def publish_links(self, row: LinkRow) -> bool:
        """Publish this peer's row of the link matrix."""
        self._check_own(row.src, "src")
        return self._publish("links", row, self.config.links_lifetime_s)

    def publish_job(self, job: JobRecord, *, ttl_s: float | None = None) -> bool:
        """Publish the job (the coordinator does; the record is keyed by its identity)."""
        return self._publish("job", job, ttl_s or self.config.record_ttl_s)

    def publish_plan(self, plan: PlanRecord, *, ttl_s: float | None = None) -> bool:
        """Publish a plan version; it replaces this owner's previous plan."""
        return self._publish("plan", plan, ttl_s or self.config.record_ttl_s)

    def publish_progress(self, progress: ProgressRecord, *, ttl_s: float | None = None) -> bool:
        """Publish this peer's progress, expiring after ``ttl_s`` (default ``record_ttl_s``).

        A job's peers publish it every liveness period with :meth:`SwarmConfig.liveness_ttl_s` of lifetime:
        for the coordinator a plan peer whose progress expired is gone (as a peer whose record expired is for
        everyone).
        """
        self._check_own(progress.peer_id, "peer_id")
        return self._publish("progress", progress, min(ttl_s or self.config.record_ttl_s, self.config.max_ttl_s),
                             replicas=self.config.progress_replicas)

    def publish_digest(self, digest: RegionDigest, *, ttl_s: float) -> bool:
        """Publish the progress digest of this peer's region (its collector does, :mod:`geotrain.peers.digest`).

        Stored on ``progress_replicas`` nodes like a progress record; it replaces this peer's previous digest.
        """
        self._check_own(digest.collector, "collector")
        return self._publish("digest", digest, min(ttl_s, self.config.max_ttl_s),
                             replicas=self.config.progress_replicas)

    def start_heartbeat(self, make_record: Callable[[], PeerRecord]) -> Heartbeat:
        """Republish ``make_record()`` every ``heartbeat_s`` in a background thread (first one now)."""
        from geotrain.swarm.heartbeat import Heartbeat

        hb = Heartbeat(self, make_record, period_s=self.config.heartbeat_s)
        self._heartbeats.append(hb)
        hb.start()
        return hb

    # -- reading ---------------------------------------------------------------------------------
    def get_peers(self, *, thorough: bool = True) -> dict[str, PeerRecord]:
        """Live peer records by peer id (a record naming another peer than its signer is dropped).

        With a swarm key, only members with a valid admission proof are returned. ``thorough=False``:
        one replica's copy (a fifth of the bytes; it may miss a record that replica has not got).
        """
        peers = self._get("peers", PeerRecord, owner_field="peer_id", thorough=thorough)
        self._size = max(1, len(peers))
        if self.admission is not None:
            adm = self.admission
            peers = {p: r for p, r in peers.items() if adm.verify(p, r.curve_public_key, r.admission)}
            self._members = set(peers)
        return peers

    def get_links(self) -> dict[str, LinkRow]:
        return self._members_only(self._get("links", LinkRow, owner_field="src"))

    def get_jobs(self, *, thorough: bool = True) -> dict[str, JobRecord]:
        """Live jobs by the peer id of the coordinator that published them (verified, with a swarm key).

        ``thorough=False``: one replica's copy (see :meth:`get_peers`).
        """
        jobs = self._get("job", JobRecord, thorough=thorough)
        if self.admission is not None:
            adm = self.admission
            jobs = {o: j for o, j in jobs.items() if adm.verify(o, j.curve_public_key, j.admission)}
        return jobs

    def _members_only(self, records: dict[str, R]) -> dict[str, R]:
        if self.admission is None:
            return records
        if not self._members:
            self.get_peers()
        return {o: r for o, r in records.items() if o in self._members}

    def get_plans(self) -> dict[str, PlanRecord]:
        """Live plans by publisher peer id."""
        return self._get("plan", PlanRecord)

    def latest_plan(self, *, job_id: str, publisher: str | None = None) -> PlanRecord | None:
        """The highest-version live plan for ``job_id`` (from ``publisher`` only, if given)."""
        plans = [
            p
            for owner, p in self.get_plans().items()
            if p.job_id == job_id and (publisher is None or owner == publisher)
        ]
        return max(plans, key=lambda p: p.version, default=None)

    def get_progress(self, *, thorough: bool = True) -> dict[str, ProgressRecord]:
        """Live progress records by peer id (``thorough=False``: one replica's copy, as for :meth:`get_peers`)."""
        return self._members_only(self._get("progress", ProgressRecord, owner_field="peer_id", thorough=thorough))

    def get_digests(self, *, thorough: bool = False) -> dict[str, RegionDigest]:
        """Live region digests by collector peer id (a digest naming another collector than its signer is
        dropped). Quick by default: one replica's copy, which is what a coordinator's tick needs."""
        return self._members_only(self._get("digest", RegionDigest, owner_field="collector", thorough=thorough))

    # -- internals -------------------------------------------------------------------------------
    def _require(self) -> SwarmDHT:
        if self._dht is None:
            raise SwarmError("the swarm is not started; call start() or use `with Swarm(...)`")
        return self._dht

    def _check_own(self, claimed: str, field: str) -> None:
        if claimed != self.peer_id:
            raise RecordError(f"record {field} {claimed!r} is not this peer's id {self.peer_id!r}")

    def _wait(self, future: Any, what: str) -> Any:
        # Wait in short slices so a DHT process that died (killed, or crashed on bad input)
        # is reported at once instead of after the whole deadline.
        deadline = time.monotonic() + self.config.timeout_s
        while True:
            try:
                return future.result(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
            except TimeoutError as e:
                if self._dht is None or not self._dht.is_alive():
                    future.cancel()
                    code = None if self._dht is None else self._dht.exitcode
                    raise SwarmError(f"the DHT process died (exit code {code}) during {what}") from e
                if time.monotonic() >= deadline:
                    future.cancel()
                    raise DHTTimeoutError(f"DHT {what} took longer than {self.config.timeout_s}s") from e
            except CancelledError as e:
                raise DHTTimeoutError(f"DHT {what} was cancelled (is the DHT process still running?)") from e

    def _publish(self, kind: str, record: _Record, ttl_s: float, *, replicas: int | None = None) -> bool:
        """Sign and store ``record`` under ``kind``'s key on its ``replicas`` nearest nodes (None: all 5)."""
        from hivemind.utils import MSGPackSerializer, get_dht_time

        cfg = self.config
        if not 0 < ttl_s <= cfg.max_ttl_s:
            raise RecordError(f"{kind} ttl {ttl_s}s must be in (0, max_ttl_s={cfg.max_ttl_s}]")
        value = record.to_wire()
        packed = MSGPackSerializer.dumps(value)
        # Refuse here, with a clear error, what every validator would refuse anyway (the signature
        # adds ~400 bytes, hence the margin).
        if len(packed) + 512 > cfg.max_value_bytes:
            raise RecordError(
                f"{kind} record of {len(packed)} bytes is over the swarm limit {cfg.max_value_bytes}"
            )
        scan_msgpack(packed, max_depth=cfg.max_depth)
        with self._lock:
            # hivemind keeps the entry with the later expiration: each publication must expire later
            expiration = max(get_dht_time() + ttl_s, self._last_expiration.get(kind, 0.0) + 1e-3)
            self._last_expiration[kind] = expiration

        from geotrain.swarm.dht_process import store_direct

        # straight to the key's replicas, never into this node's own storage: a node that is no replica
        # (client mode, or not among the nearest) would otherwise hold one record that a quick read of its
        # own takes for the whole dictionary. The replicas are looked up again (an O(N) answer from each
        # node asked) every 5 minutes, or 10 s per peer in a large swarm, and whenever most did not answer.
        future = self._require().run_coroutine(
            partial(store_direct, key=dht_key(cfg.swarm, kind), subkey=self._owner_subkey, value=value,
                    expiration=expiration, refresh_s=max(300.0, 10.0 * self._size), beam=max(cfg.read_beam, 5),
                    replicas=replicas),
            return_future=True,
        )
        started = time.monotonic()
        ok = bool(self._wait(future, f"store {kind}"))
        took = time.monotonic() - started
        _ops_log.debug("store %s %d bytes in %.2fs", kind, len(packed), took)
        if took > 1.0:  # a record renewed late may have expired meanwhile: worth knowing why a peer looked gone
            logger.info("DHT store of our %s record took %.1fs", kind, took)
        if not ok:
            logger.warning("no DHT node accepted our %s record", kind)
        return ok

    def _get(
        self, kind: str, model: type[R], *, owner_field: str | None = None, thorough: bool = True
    ) -> dict[str, R]:
        from hivemind.utils import get_dht_time

        future = self._require().get(
            dht_key(self.config.swarm, kind), latest=thorough, beam_size=self.config.read_beam, return_future=True,
            # a quick read asks one node at a time and stops at the first copy: one O(N) answer
            **({} if thorough else {"num_workers": 1}),
        )
        found = self._wait(future, f"get {kind}")
        _ops_log.debug("get %s thorough=%s %d records", kind, thorough,
                       len(found.value) if found is not None and isinstance(found.value, dict) else 0)
        if found is None or not isinstance(found.value, dict):
            return {}
        now = get_dht_time()
        out: dict[str, R] = {}
        for subkey, item in found.value.items():
            try:
                if item.expiration_time <= now:
                    continue
                owner = _owner_peer_id(subkey)
                record = model.model_validate(item.value, strict=True)
                if owner_field is not None and getattr(record, owner_field) != owner:
                    raise RecordError(
                        f"{kind} record claims {getattr(record, owner_field)!r} but is signed by {owner!r}"
                    )
            except (ValidationError, RecordError, ValueError, TypeError, AttributeError) as e:
                logger.debug("skipped a %s record: %s", kind, e)
                continue
            out[owner] = record
        return out


def _owner_peer_id(subkey: object) -> str:
    if not isinstance(subkey, bytes):
        raise RecordError("subkey is not an owner key")
    match = _OWNER_RE.fullmatch(subkey)
    if match is None:
        raise RecordError("subkey is not an owner key")
    return peer_id_from_public_key(match.group(1))
