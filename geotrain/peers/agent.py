"""The peer agent: one process's life in the swarm.

Lifecycle (``geotrain peer``):

1. measure compute (a short matmul benchmark), start the data plane, join the DHT;
2. publish the peer record and keep it alive (heartbeat = record expiry);
3. probe links (RTT + bulk bandwidth) to a few peers of its region, representatives of each other
   region and the peers its plan makes it exchange with (:mod:`geotrain.swarm.probe_targets`), and
   publish the row, probing new targets at once and re-probing each every ``probe_every_s``;
4. follow the newest job and its newest plan (from the job's publisher only);
   when the plan names this peer, build a :class:`~geotrain.peers.worker.StageWorker`
   and run inner steps; when a newer plan arrives, rebuild from the global
   state (own, a group member's, or the last checkpoint) at the plan's start step;
5. report progress on the DHT; serve stage state to joiners and the coordinator.

With ``devices`` (``--nproc-per-node``, ``--devices``) the peer starts its other local ranks first
(:mod:`geotrain.peers.ranks`); it stays one member of the swarm, its record giving the node's compute.
A local rank that dies makes the peer publish ``left`` and stop: the coordinator plans around it.

What happens when a neighbour dies mid-step: the step fails with
:class:`~geotrain.errors.StageFailedError`, its gradients are dropped, the
peer reports ``stalled`` and waits (bounded, with backoff) for a newer plan.
Nothing half-done is applied: inner weights stay as after the last completed
step, and the next plan restarts every peer from committed global state.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from geotrain import __version__
from geotrain.config import JobSpec, job_from_dict
from geotrain.errors import (
    ConfigError,
    GeotrainError,
    LocalRankError,
    PlanSupersededError,
    StateLostError,
    TransportError,
)
from geotrain.peers.lifecycle import Adopt, MoveStop, after_failure, next_work, plan_change
from geotrain.peers.localise import localise_job
from geotrain.peers.probe import ProbeConfig, measure_link, serve_probes
from geotrain.plan import JobPlan
from geotrain.swarm import Swarm
from geotrain.swarm.digest import DigestRelay
from geotrain.swarm.news import JOB_NEWS, PLAN_NEWS, PROGRESS_NEWS, Contact, NewsWaiter, send_news, serve_news
from geotrain.swarm.probe_targets import probe_targets
from geotrain.swarm.records import (
    InboundLinkReport,
    LinkMeasurement,
    LinkRow,
    PeerRecord,
    PeerStatus,
    ProgressRecord,
)
from geotrain.transport import Transport

logger = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """What a peer offers and how it behaves. ``job_id`` pins one job (default: the newest).

    The control plane stays quiet (docs/swarm.md, "What the control plane costs"): the job and plan
    records are read when news says they changed, else every ``watch_every_s`` while following a job,
    ``watch_idle_s`` before one is known and ``poll_s`` while stalled; the peer list (probe targets,
    the allow-list; O(N) bytes) from one replica every ``view_every_s`` or N x ``view_per_peer_s``,
    whichever is longer (``view_in_plan_s`` at least while a plan holds this peer: it probes nobody then,
    and its plan names its partners), and at once when a new plan arrives or a closed swarm's data plane
    refused an unknown key. A peer that follows a job publishes its progress at once when its status, plan or
    lost blocks change, on a new round or checkpoint no sooner than half a liveness period after its last
    write, and else every liveness period (the job's
    ``swarm.heartbeat_s``, or ``--heartbeat`` or ``progress_every_s`` when shorter), expiring after 3
    and an RPC timeout:
    the coordinator takes a plan peer without live progress for gone, so the peer record itself beats
    at the slow ``--heartbeat`` period.
    """

    region: str
    usd_per_hour: float = 0.0
    device: str = "cpu"
    probe_every_s: float = 3600.0
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    poll_s: float = 2.0
    watch_every_s: float = 30.0
    watch_idle_s: float = 30.0
    view_every_s: float = 30.0
    # the peer list costs one O(N) answer per read: 8 s per peer keeps it ~0.2 KB/s per peer at any N (at 4 s it
    # was the largest idle term, and the one hivemind answers locally in a small swarm: the idle growth with N)
    view_per_peer_s: float = 8.0
    view_in_plan_s: float = 90.0
    progress_every_s: float = 10.0
    stall_wait_s: float = 120.0
    job_id: str | None = None
    benchmark_s: float = 0.5
    data_dir: str | None = None  # where this peer's copy of the job's data lives (geotrain.peers.localise)
    model_dir: str | None = None  # ... and of its pretrained weights
    state_dir: str | None = None  # this peer's own checkpoints of what it holds (geotrain.peers.statestore)
    devices: tuple[str, ...] = ()  # 2 or more: one local rank per device, rank 0 here (geotrain.peers.ranks)
    rank_threads: int | None = None  # torch CPU threads of each helper rank

    def __post_init__(self) -> None:
        if self.usd_per_hour < 0:
            raise ConfigError(f"--price must be >= 0 USD/hour; got {self.usd_per_hour}")
        for name in ("poll_s", "probe_every_s", "watch_every_s", "watch_idle_s", "view_every_s", "view_per_peer_s",
                     "view_in_plan_s", "progress_every_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0; got {getattr(self, name)}")


class PeerAgent:
    """Runs one peer until ``stop`` is set. See the module docstring.

    Thread ownership (docs/architecture.md, "State machines and thread ownership"): the main thread
    (:meth:`run`) is the only writer of ``_plan``, ``_worker``, ``_status``, ``_step_now``, ``_metrics``,
    ``_last_state`` and ``_job_baseline``, and swaps them under ``_lock``; the progress thread and the
    handler pool (state requests) read them under ``_lock``, so they see one plan with its own worker and
    status, never a mix. ``_latest`` is written by the watcher thread and read by the main thread, under
    ``_lock`` too. ``_job``, ``_job_key``, ``_following`` and ``_coordinator`` belong to the watcher thread
    (the others only read the reference); the probe thread owns ``_links``, ``_probed_at`` and the allow-list,
    and only tests ``_worker is None`` (a hint that paces its probes) without the lock.
    Nothing slow (a worker's build, close or step, a DHT write) runs while holding ``_lock``.
    ``_digests`` (built at start) owns its own state behind its own lock (:class:`DigestRelay`): the progress
    writers hand it each record written, the handler pool its region's lines when this peer collects them.
    """

    def __init__(self, config: AgentConfig, *, swarm: Swarm, transport: Transport, emit: Emit | None = None) -> None:
        self.config = config
        self.swarm = swarm
        self.transport = transport
        self.peer_id = swarm.peer_id
        self._emit = emit or (lambda e: None)
        self._stop = threading.Event()
        self._record: PeerRecord | None = None
        self._links: dict[str, LinkMeasurement] = {}
        self._probed_at: dict[str, float] = {}
        self._probe_failures: dict[str, int] = {}  # failed probes of a target since its last success
        self._view_now = threading.Event()  # set on a new plan: read the peer list (allow-list, partners) now
        self._started = 0.0  # this peer's started_at (who probes whom: the younger peer measures a pair)
        self._seen = 0  # peers in the last read of the peer list (paces the next read)
        self._progress_sig: Any = None  # what the last progress record said (status, job, plan), and when
        self._progress_at = 0.0
        self._clock = time.monotonic  # paces progress (tests inject their own)
        self._links_published_at = 0.0
        self._worker: Any = None  # StageWorker of the current plan
        self._last_state: Any = None  # StageState kept from the previous worker, for rebuilds
        self._plan: JobPlan | None = None
        self._job: JobSpec | None = None
        self._job_key: tuple[str, str] | None = None  # (publisher, job id) of the parsed job
        self._status = PeerStatus.IDLE
        self._lock = threading.Lock()  # guards the main thread's swaps (see the class docstring) and _latest
        self._latest: tuple[JobSpec, str, JobPlan] | None = None  # newest (job, id, plan) the watcher saw
        self._news = threading.Event()  # set by the watcher when it read the DHT
        self._step_now = 0  # steps completed under the current plan (for progress)
        self._metrics: Any = None  # the last inner step's StepMetrics
        self._device = config.device  # torch device the stage trains on ("auto" resolved at start)
        self._allowed_seen: dict[bytes, float] = {}  # CURVE key -> last seen in a verified record
        self._job_baseline: Any = None  # transport counters when this peer joined the current job
        self._following: str | None = None  # the job this peer follows (before any plan names it)
        self._threads: list[threading.Thread] = []
        # the watcher reads the DHT every poll_s, or at once when the coordinator sends news of a plan
        self._plan_news = NewsWaiter(self._stop, poll_s=config.poll_s)
        self._coordinator: Contact | None = None  # where to send news of this peer's progress
        self._plan_cache: Any = None  # (job key, (version, stop step), JobPlan) of the watcher's last plan read
        self._sync_router: Any = None  # GroupRouter: sync.ping / sync.ask on this transport, built at start
        self._store: Any = None  # StateStore of config.state_dir, built at start
        self._lost: Any = None  # StateLostError of the current plan: blocks nobody holds (progress reports them)
        self._ranks: Any = None  # LocalRanks: this peer's other local ranks (config.devices), started at start
        self._digests: DigestRelay | None = None  # built at start

    # -- setup ------------------------------------------------------------------------------------
    def start(self) -> PeerRecord:
        from geotrain.peers.benchmark import BenchmarkConfig, measure_compute

        devices = self.config.devices
        device = devices[0] if devices else self.config.device
        compute = measure_compute(BenchmarkConfig(device=device, max_seconds=self.config.benchmark_s))
        # a bf16 job is planned on bf16 speed (tensor cores: several times fp32; a CPU: often slower)
        bf16 = measure_compute(BenchmarkConfig(device=device, dtype="bfloat16", max_seconds=self.config.benchmark_s))
        # "auto" resolves to what the benchmark found (cuda, else cpu)
        self._device = compute.device_type if device == "auto" else device
        # a node's compute: N distinct accelerators add up; N ranks on one CPU share its cores (no more flops).
        # Its memory stays one device's: every rank holds the whole stage, so a stage must fit one of them
        scale = len(devices) if len(devices) > 1 and len(set(devices)) == len(devices) else 1
        device_name = compute.device if len(devices) < 2 else f"{compute.device} x{len(devices)} ranks"
        if len(devices) > 1:
            from geotrain.peers.ranks import LocalRanks

            self._ranks = LocalRanks(devices, threads=self.config.rank_threads).start()
        started = self._started = time.time()

        def make_record() -> PeerRecord:
            return PeerRecord(
                peer_id=self.peer_id,
                region=self.config.region,
                device=device_name[:128],
                flops=float(compute.flops) * scale,
                flops_bf16=float(bf16.flops) * scale,
                memory_bytes=int(compute.memory_bytes),
                usd_per_hour=float(self.config.usd_per_hour),
                endpoint=self.transport.address,
                version=__version__,
                curve_public_key=None
                if self.transport.config.curve is None
                else self.transport.config.curve.public_key.decode(),
                admission=None if self.swarm.admission is None else self.swarm.admission.own_proof(self.peer_id),
                started_at=started,
                heartbeat_at=time.time(),
                endpoints=list(self.transport.endpoints),  # advertised; the reachability preflight's verdict:
                reachable=self.transport.reachable,
            )

        self._record = make_record()
        # torch's one-time initialisation (~1 s on a CPU core) overlaps joining, not the first plan
        warm = threading.Thread(target=self._warm_up, name="gt-warm", daemon=True)
        warm.start()
        self._threads.append(warm)
        serve_probes(self.transport)
        # sync.ping is answered from the start: a stage-group member checks its round leader with it, maybe
        # before the leader has built its round runner; one router serves it and sync.ask for every group
        from geotrain.sync.round import GroupRouter

        self._sync_router = GroupRouter(self.transport)
        from geotrain.sync.state import serve_state

        stored = None
        if self.config.state_dir is not None:
            from pathlib import Path

            from geotrain.peers.statestore import StateStore

            store = self._store = StateStore(Path(self.config.state_dir))

            def stored(job_id: str, start: int, end: int, step: int) -> Any:
                return store.load(job_id, step, start, end)

        serve_state(self.transport, lambda: self._locked("_worker"), lambda: self._locked("_last_state"), stored,
                    newer=self._heard_of_plan)
        # a message stamped with a newer plan of our job: its sender read a plan we have not (lost news)
        self.transport.on_newer_plan(self._plan_news.poke)
        serve_news(self.transport, PLAN_NEWS, self._plan_news)
        serve_news(self.transport, JOB_NEWS, self._plan_news)
        # this peer's line of its region's progress digest (or, as the region's collector, the digest itself)
        self._digests = DigestRelay(self.transport, self.swarm, region=self.config.region,
                                    plan=lambda: self._locked("_plan"))
        self._digests.serve()
        hb = self.swarm.start_heartbeat(make_record)
        hb.wait_first(timeout=self.swarm.config.timeout_s)
        for target, name in ((self._probe_loop, "probe"),):
            t = threading.Thread(target=target, name=f"gt-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self._record

    def _heard_of_plan(self, job_id: str, version: int) -> None:
        """A state request says its asker follows plan ``version`` of ``job_id``: read the plan now if that is
        newer than ours (a peer a replan moved out may not have heard of it; its state is being asked for)."""
        plan = self._locked("_plan")
        if plan is not None and plan.job_id == job_id and version > plan.version:
            self._plan_news.poke()

    def local_rank_pids(self) -> list[int]:
        """Process ids of this peer's helper ranks (none without ``devices``)."""
        return self._ranks.pids() if self._ranks is not None else []

    def _locked(self, name: str) -> Any:
        """One of the main thread's fields, read under ``_lock`` (for other threads)."""
        with self._lock:
            return getattr(self, name)

    def _warm_up(self) -> None:
        from geotrain.peers.benchmark import warm_up_torch

        try:
            logger.debug("torch warmed up in %.2fs", warm_up_torch(self._device))
        except Exception as e:  # an odd device must not stop the peer: the first plan pays instead
            logger.info("torch warm-up failed: %s", e)

    def stop(self) -> None:
        self._stop.set()
        self._plan_news.poke()
        self._view_now.set()

    # -- link probes ------------------------------------------------------------------------------
    def _probe_loop(self) -> None:
        while not self._stop.is_set():
            retry = False
            try:
                retry = self._probe_once()
            except GeotrainError as e:
                logger.info("probe round failed: %s", e)
                retry = True
            # the peer list is O(N) bytes per read: read it every view_every_s, or N x view_per_peer_s in a
            # large swarm (a new plan wakes this at once); sooner only while a target has not been measured
            # yet (it may have just joined, or a closed swarm's allow-lists not have it yet)
            # ... and in this peer's first view_every_s, while the records of the peers that joined with it
            # are still arriving
            young = time.time() - self._started < self.config.view_every_s
            period = self.config.poll_s * 2 if retry or young else min(
                self.config.probe_every_s, max(self.config.view_every_s, self.config.view_per_peer_s * self._seen))
            # ... and in a plan at least every view_in_plan_s: a placed peer or a spare probes nobody, its plan
            # names its partners and their keys, and a joiner it must admit wakes this at once (a refused key);
            # what is left is the allow-list's renewal (a key stays admitted for a record lifetime, 120 s: one
            # quick read that misses a member does not drop it while this period is shorter) and forgetting links
            with self._lock:
                in_plan = self._plan is not None
            if in_plan and not (retry or young):
                period = max(period, self.config.view_in_plan_s)
            self._wait_view(period)

    def _wait_view(self, period: float) -> None:
        """Until the next read of the peer list: ``period``, a new plan, or (closed swarm) a refused key."""
        deadline = time.monotonic() + period
        closed = self.swarm.admission is not None and self.transport.config.curve is not None
        refused = self.transport.stats.dropped.get("AuthenticationError", 0)
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self._view_now.wait(min(left, self.config.poll_s) if closed else left):
                break
            if closed and self.transport.stats.dropped.get("AuthenticationError", 0) > refused:
                break  # somebody this peer does not know yet dialled it: a joiner, most likely
        self._view_now.clear()

    def _refresh_allow_list(self, peers: dict[str, PeerRecord]) -> None:
        """With a swarm key: admit exactly the verified members (and coordinators) on the data plane."""
        if self.swarm.admission is None or self.transport.config.curve is None:
            return
        now = time.monotonic()
        keys = [r.curve_public_key for r in peers.values() if r.curve_public_key]
        job_keys = {j.curve_public_key.encode() for j in self.swarm.get_jobs(thorough=False).values()
                    if j.curve_public_key}
        if job_keys - set(self._allowed_seen):
            # a coordinator this peer did not admit yet: its news of the job was refused; read the job now
            self._plan_news.poke()
        keys += [k.decode() for k in job_keys]
        coordinator = self._coordinator  # the job this peer follows, as its watcher read it (every poll)
        if coordinator is not None and coordinator.curve_public_key:
            keys.append(coordinator.curve_public_key)
        with self._lock:
            plan = self._plan
        if plan is not None:  # the plan's peers, as the coordinator verified them (a quick read may miss one)
            keys += [sl.curve_public_key for pipe in plan.pipelines for sl in pipe if sl.curve_public_key]
        for k in keys:
            self._allowed_seen[k.encode()] = now
        # a member missing from one DHT read stays admitted; one gone for a record lifetime does not
        ttl = self.swarm.config.record_ttl_s
        self._allowed_seen = {k: t for k, t in self._allowed_seen.items() if now - t <= ttl}
        self.transport.allow_clients(set(self._allowed_seen))

    def _pipeline_neighbours(self, plan: JobPlan) -> set[str]:
        at = plan.slot_of(self.peer_id)
        if at is None:
            return set()
        pipe = plan.pipelines[at[0]]
        return {pipe[s].peer for s in (at[1] - 1, at[1] + 1) if 0 <= s < len(pipe)}

    def _probe_once(self) -> bool:
        """One probe round; True when a wanted target is still unmeasured and worth a retry soon."""
        peers = self.swarm.get_peers(thorough=time.time() - self._started < self.config.view_every_s)
        self._seen = len(peers)
        self._refresh_allow_list(peers)
        now = time.time()
        changed = False
        # a few older peers of this region and representatives of each other one, not everyone
        # (probe_targets: the younger side measures a pair), plus the peers the current plan makes this
        # peer exchange with (their pair carries real traffic)
        started = {pid: r.started_at for pid, r in peers.items()}
        started[self.peer_id] = self._started
        regions = {pid: r.region for pid, r in peers.items()}
        regions.setdefault(self.peer_id, self.config.region)
        dial_out = {pid for pid, r in peers.items() if r.dial_back} | ({self.peer_id} if self.transport.dial_out else set())
        wanted = set(probe_targets(self.peer_id, regions, started=started, dial_out=dial_out))
        with self._lock:
            plan = self._plan
        if plan is not None:
            wanted |= {m for g in plan.groups_of(self.peer_id) for m in g.members} | self._pipeline_neighbours(plan)
        for pid, rec in sorted(peers.items()):
            if pid == self.peer_id or pid not in wanted or self._stop.is_set():
                continue
            if now - self._probed_at.get(pid, 0.0) < self.config.probe_every_s:
                continue
            if plan is not None:
                # in a plan (training, building its stage, or a spare): no bulk probes on the data plane, whose
                # bytes are the job's now; a pair was measured by its younger side before, or priced by regions
                continue
            try:
                self.transport.connect(pid, rec.endpoint, region=rec.region, curve_server_key=_curve_key(rec))
                m = measure_link(self.transport, pid, self.config.probe)
            except (TransportError, ConfigError) as e:
                # tried again next round (the transport redials a refused CURVE handshake on its own)
                logger.info("probe of %s failed: %s", pid, e)
                self._probe_failures[pid] = self._probe_failures.get(pid, 0) + 1
                continue
            self._links[pid] = LinkMeasurement(bandwidth_bps=m.bandwidth_bps, rtt_s=m.rtt_s, measured_at=m.measured_at)
            self._probed_at[pid] = time.time()
            self._probe_failures.pop(pid, None)
            changed = True
        # forget a link only once its peer has been gone long enough: one DHT read may miss a live peer
        for pid in list(self._links):
            if pid not in peers and now - self._links[pid].measured_at > self.swarm.config.record_ttl_s:
                del self._links[pid]
                changed = True
        # republish when something changed, and before the row's DHT lifetime runs out
        if changed or now - self._links_published_at > self.swarm.config.links_lifetime_s / 2:
            self.swarm.publish_links(LinkRow(src=self.peer_id, links=dict(self._links)))
            self._links_published_at = now
            self._emit({"event": "links", "peer_id": self.peer_id, "count": len(self._links)})
        # a target never measured (not yet dialable, refused by a closed swarm's allow-list that has not
        # seen us yet) is retried soon, a few times; then at the normal pace
        return plan is None and any(
            pid in peers and pid not in self._probed_at and self._probe_failures.get(pid, 0) <= 5
            for pid in wanted if pid != self.peer_id)

    # -- following the job ------------------------------------------------------------------------
    def _current(self) -> tuple[JobSpec, str, JobPlan] | None:
        """The job this peer follows and its newest plan, or None.

        The job records come from one replica when this is the fallback poll, from all on news.
        """
        jobs = self.swarm.get_jobs(thorough=self._plan_news.had_news)
        candidates = [
            (owner, rec) for owner, rec in jobs.items() if self.config.job_id in (None, rec.job_id)
        ]
        if not candidates:
            return None
        owner, rec = max(candidates, key=lambda x: x[1].published_at)
        key = (owner, rec.job_id)
        if self._job is None or self._job_key != key:
            try:
                self._job = localise_job(job_from_dict(rec.spec), data_dir=self.config.data_dir,
                                         model_dir=self.config.model_dir)
            except ConfigError as e:
                logger.warning("ignoring job %s from %s: %s", rec.job_id, owner, e)
                return None
            self._job_key = key
        job = self._job
        self._following = rec.job_id  # progress says "idle, following this job" until a plan names us
        self._coordinator = (
            Contact(owner, rec.endpoint, curve_public_key=rec.curve_public_key) if rec.endpoint else None
        )
        if (self.swarm.admission is not None and self.transport.config.curve is not None and rec.curve_public_key
                and rec.curve_public_key.encode() not in self._allowed_seen):
            self._view_now.set()  # a coordinator not admitted yet: the probe thread refreshes the allow-list now
        if self.transport.dial_out and rec.endpoint and self._coordinator is not None:
            # behind NAT: open the connection the coordinator answers over (news, state requests)
            server_key = rec.curve_public_key.encode() if rec.curve_public_key else None
            self.transport.connect(owner, rec.endpoint, curve_server_key=server_key)
        # the plan record is O(N) bytes: read it only when the job record's pointer moved, news came, or
        # the coordinator publishes no pointer (an older one)
        head = (rec.plan_version, rec.plan_stop_step)
        cached = self._plan_cache
        if (cached is not None and cached[0] == key and rec.plan_version is not None and cached[1] == head
                and not self._plan_news.had_news):
            return job, rec.job_id, cached[2]
        prec = self.swarm.latest_plan(job_id=rec.job_id, publisher=owner)
        if prec is None:
            return None
        try:
            plan = JobPlan.from_dict(prec.plan)
        except ConfigError as e:
            logger.warning("ignoring malformed plan v%s: %s", prec.version, e)
            return None
        # what was read, as a pointer: a replica behind the pointer makes the next poll read again
        self._plan_cache = (key, (plan.version, plan.stop_step), plan)
        return job, rec.job_id, plan

    def _watch_loop(self) -> None:
        """Background: read the job and its newest plan every ``poll_s`` (DHT reads stay off the training thread)."""
        while not self._stop.is_set():
            try:
                current = self._current()
            except GeotrainError as e:
                logger.info("could not read job/plan: %s", e)
                current = None
            if current is not None:
                with self._lock:
                    self._latest = current
                    worker, mine = self._worker, self._plan
                plan = current[2]
                if worker is not None and mine is not None and (
                    plan.job_id != mine.job_id or plan.version > mine.version
                ):
                    # a step stuck on a neighbour of the old plan (dead, or replanned elsewhere) gives up now
                    worker.interrupt(f"plan v{plan.version} of job {plan.job_id!r} was published")
                self._news.set()
            # news (the coordinator's, of a new job or plan) wakes this at once; the poll is the fallback
            self._plan_news.poll_s = self._watch_period()
            self._plan_news.wait()

    def _liveness_s(self) -> float:
        """How often a peer that follows a job republishes its progress (it expires after 3 of these and an
        RPC timeout).

        The job's ``swarm.heartbeat_s`` (or the command line's ``--heartbeat`` when shorter): the
        coordinator takes a plan peer without live progress for gone, so while in a job the progress
        record is the heartbeat that matters and the peer record can beat at its slow idle period.
        """
        job = self._job
        period = self.swarm.config.heartbeat_s
        if job is not None:
            period = min(period, job.swarm.heartbeat_s)
        return min(period, self.config.progress_every_s)

    def _watch_period(self) -> float:
        """How long the watcher waits for news before it reads the job and plan records anyway."""
        with self._lock:
            stalled = self._status == PeerStatus.STALLED
        if stalled:  # a replan is expected soon, and its news may have been lost
            return self.config.poll_s
        return self.config.watch_every_s if self._following is not None else self.config.watch_idle_s

    def _progress_loop(self) -> None:
        """Background: publish this peer's progress when it changes, and every liveness period.

        A peer that follows a job republishes its progress every :meth:`_liveness_s` (it expires after 3),
        at once when what the coordinator must act on at once changes (status, the job followed, plan, lost
        blocks), and when a round or a checkpoint's shards moved on but only half a period after the last
        one: a fast job's rounds come every few seconds, and one write per round to 5 replicas was most of a
        training peer's control-plane bytes.
        """
        while not self._stop.wait(min(1.0, self.config.progress_every_s)):
            self._progress_tick()

    def _progress_tick(self) -> bool:
        """Publish progress if it changed or is due (see :meth:`_progress_loop`); True if it did."""
        with self._lock:
            step, metrics = self._step_now, self._metrics
            plan, w = self._plan, self._worker
            urgent = (self._status, self._following, None if plan is None else (plan.job_id, plan.version),
                      self._lost is not None)
            rnd = None if w is None else w.round
        # the shards this peer holds (a checkpoint round's): the coordinator's manifests list them
        shards = None if self._store is None or plan is None else tuple(
            sh.step for sh in self._store.written(plan.job_id))
        since = self._clock() - self._progress_at
        last = self._progress_sig or (None, None)
        moved = (rnd, shards) != last[1] and since >= self._liveness_s() / 2
        if urgent == last[0] and not moved and since < self._liveness_s():
            return False
        self._publish_progress(step, metrics)
        followed_before = last[0][1] if last[0] is not None else None
        if urgent[1] is not None and urgent[1] != followed_before:
            # a job newly followed: its coordinator reads every replica now (its quick read may come from a replica
            # that lacks this new record, and it looks further only for a plan peer it misses)
            self._tell_coordinator()
        self._progress_sig, self._progress_at = (urgent, (rnd, shards)), self._clock()
        return True

    def run(self) -> int:
        """The main loop; returns when ``stop()`` is called. Exit code."""
        for target, name in ((self._watch_loop, "watch"), (self._progress_loop, "progress")):
            t = threading.Thread(target=target, name=f"gt-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        step = 0
        stalled_since: float | None = None
        while not self._stop.is_set():
            try:
                if self._ranks is not None:
                    self._ranks.check()  # a spare notices a dead rank too, not only a step
            except LocalRankError as e:
                self._leave(step, e)
                return 3
            with self._lock:
                current = self._latest
            change = plan_change(self._plan, current[2] if current is not None else None)
            if isinstance(change, Adopt):
                assert current is not None
                try:
                    step = self._adopt(current[0], change.plan, step)
                except LocalRankError as e:
                    self._leave(step, e)
                    return 3
                stalled_since = None
            elif isinstance(change, MoveStop):
                # the coordinator moved the stop (tokens, time or budget reached): nothing to rebuild
                with self._lock:
                    assert self._plan is not None
                    self._plan = dataclasses.replace(self._plan, stop_step=change.stop_step)
            work = next_work(self._plan, has_worker=self._worker is not None, step=step)
            if work == "wait":
                self._news.wait(self.config.poll_s)
                self._news.clear()
                continue
            if work == "finish":
                self._finish(step)
                continue
            try:
                metrics = self._worker.step(step)
                step += 1
                with self._lock:
                    self._metrics, self._step_now, self._status = metrics, step, PeerStatus.TRAINING
            except LocalRankError as e:
                self._leave(step, e)
                return 3
            except PlanSupersededError as e:
                # not a stall: the loop adopts the newer plan now (nothing of the step was applied)
                logger.info("step %d: %s", step, e)
                continue
            except GeotrainError as e:
                # a neighbour died or timed out (or a round could not run): wait for the next plan; a retry of
                # the same step resumes after its optimizer step (StageWorker.step), never applies it twice
                failure = after_failure(stalled_since, self._clock(), self.config.stall_wait_s)
                stalled_since = failure.since
                if failure.report:
                    self._emit({"event": "stalled", "peer_id": self.peer_id, "step": step, "error": str(e)})
                    logger.warning("step %d failed: %s; waiting for a new plan", step, e)
                    with self._lock:
                        self._status = PeerStatus.STALLED
                    self._publish_progress(step, self._metrics)
                    self._tell_coordinator()
                if failure.give_up:
                    logger.error("no new plan within %.0fs of a failure; leaving the job", self.config.stall_wait_s)
                    self._retire()
                # back off until the watcher brings news, then retry the step or adopt the new plan
                self._news.wait(min(2.0, self.config.poll_s * 2))
                self._news.clear()
        self._retire()
        self._close_local()
        return 0

    def _close_local(self) -> None:
        if self._digests is not None:
            self._digests.close()
        if self._store is not None:
            self._store.close()
        if self._ranks is not None:
            self._ranks.close()

    def _leave(self, step: int, error: Exception) -> None:
        """A local rank died (or missed a collective): say ``left`` and stop; the coordinator plans around us."""
        logger.error("step %d: %s; this peer leaves the job", step, error)
        self._emit({"event": "error", "peer_id": self.peer_id, "step": step, "error": str(error),
                    "kind_of": "local_rank"})
        with self._lock:
            self._status = PeerStatus.LEFT
        self._publish_progress(step, self._metrics)
        self._tell_coordinator()
        self.stop()
        self._retire()
        self._close_local()

    def _adopt(self, job: JobSpec, plan: JobPlan, step: int) -> int:
        """Switch to ``plan``: rebuild this peer's worker (or become a spare). Returns the step to run next."""
        from geotrain.peers.worker import StageWorker

        previous = self._plan
        old = self._worker
        state = old.state() if old is not None else None  # its committed global state, kept for rebuilds
        placed = plan.slot_of(self.peer_id) is not None
        with self._lock:  # one swap: readers see the old plan with its worker, or the new plan without one
            self._plan = plan
            if previous is None or previous.job_id != plan.job_id:
                self._job_baseline = self.transport.stats
            if state is not None:
                self._last_state = state
            self._worker = None
            self._status = PeerStatus.JOINING if placed else PeerStatus.SPARE
            if placed:
                self._step_now = plan.start_step
        self.transport.set_context(job=plan.job_id, plan_version=plan.version)
        self._view_now.set()  # the probe thread reads the peer list now: the allow-list, the plan's partners
        if old is not None:
            old.close()
        if not placed:
            self._emit({"event": "spare", "peer_id": self.peer_id, "plan_version": plan.version})
            return step
        start = plan.start_step
        same_job = previous is not None and previous.job_id == plan.job_id
        kept = self._last_state if self._last_state is not None and self._last_state.job_id == plan.job_id else None
        if self._store is not None:
            try:
                self._store.configure(keep=job.checkpoint.keep, remote=job.checkpoint.remote)
            except GeotrainError as e:  # e.g. an s3:// remote without s3fs here: no uploads, logged
                logger.error("checkpoint.remote not usable on this peer: %s", e)
        spares: list[str] = []  # new to the job past its first plan: the blocks' holders may be spares now
        if not same_job and plan.spares and (start > 0 or plan.version > 1):
            try:
                recs = self.swarm.get_peers(thorough=False)
                for pid in (p for p in plan.spares if p != self.peer_id and p in recs):
                    rec = recs[pid]
                    self.transport.connect(pid, rec.endpoint, region=rec.region, curve_server_key=_curve_key(rec))
                    spares.append(pid)
            except GeotrainError as e:  # the plan's peers are still asked
                logger.info("plan v%d's spares not reachable as state donors: %s", plan.version, e)
        try:
            worker = StageWorker(
                job,
                plan,
                peer_id=self.peer_id,
                transport=self.transport,
                previous_state=kept,
                previous_plan=previous if same_job else None,
                device=self._device,
                local=self._ranks,
                links=dict(self._links),
                router=self._sync_router,
                store=self._store,
                spares=tuple(spares),
            )
        except LocalRankError:
            raise  # the peer leaves (run)
        except GeotrainError as e:
            # e.g. a checkpoint that cannot be read: this peer sits the plan out; the coordinator replans (or,
            # for blocks nobody holds any more, stops the job: progress reports them)
            logger.error("cannot take part in plan v%d: %s", plan.version, e)
            with self._lock:
                self._status = PeerStatus.STALLED
                self._lost = e if isinstance(e, StateLostError) else None
            self._emit({"event": "error", "peer_id": self.peer_id, "plan_version": plan.version, "error": str(e)})
            return start
        with self._lock:
            self._worker, self._status, self._lost = worker, PeerStatus.TRAINING, None
        p, s = plan.slot_of(self.peer_id) or (0, 0)
        self._emit({"event": "plan", "peer_id": self.peer_id, "plan_version": plan.version, "slot": [p, s],
                    "layers": list(plan.slot(p, s).layers), "start_step": start,
                    "state": worker.state_source, "state_sha256": worker.initial_digest,
                    "local_state": worker.local_restored, "time": round(time.time(), 3)})
        return start

    def _finish(self, step: int) -> None:
        if self._status != PeerStatus.DONE:
            worker = self._worker
            assert worker is not None
            try:
                worker.finish()  # the last round in flight, then the final checkpoint
            except GeotrainError as e:  # a failed last round: the state of the rounds before it stands
                logger.warning("finishing at step %d: %s", step, e)
            state = worker.state()
            with self._lock:  # done only once the final state is there to be fetched
                self._status, self._last_state, self._step_now = PeerStatus.DONE, state, step
            self._publish_progress(step, self._metrics)
            self._tell_coordinator()
            self._emit({"event": "done", "peer_id": self.peer_id, "step": step})
        self._news.wait(self.config.poll_s)
        self._news.clear()

    def _tell_coordinator(self) -> None:
        """News of this peer's progress (just published on the DHT): the coordinator reads it now."""
        if self._coordinator is not None:
            send_news(self.transport, [self._coordinator], PROGRESS_NEWS)

    def _publish_idle(self, job_id: str) -> None:
        try:
            self.swarm.publish_progress(
                ProgressRecord(peer_id=self.peer_id, job_id=job_id, plan_version=0, step=0, loss=None, tokens=0,
                               round=0, bytes_sent=0, bytes_received=0, updated_at=time.time(),
                               status=PeerStatus.IDLE, shards=self._shards(job_id)),
                ttl_s=self.swarm.config.liveness_ttl_s(self._liveness_s()),
            )
        except GeotrainError as e:
            logger.info("progress not published: %s", e)

    def _shards(self, job_id: str) -> list[Any]:
        """The checkpoint shards of ``job_id`` in this peer's state directory (its manifests list them; before
        a plan too, so a coordinator that lost every manifest rebuilds one from the holders)."""
        if self._store is None:
            return []
        return [sh.report() for sh in self._store.held(job_id)[:16]]

    def _retire(self) -> None:
        old = self._worker
        if old is not None:
            state = old.state()
            with self._lock:
                self._last_state, self._worker = state, None
            old.close()

    def _publish_progress(self, step: int, metrics: Any) -> None:
        """Publish this peer's progress (main or progress thread): from one snapshot taken under ``_lock``."""
        with self._lock:
            following, plan, w, status = self._following, self._plan, self._worker, self._status
            last_state, base, lost = self._last_state, self._job_baseline, self._lost
        if following is not None and (plan is None or plan.job_id != following):
            self._publish_idle(following)  # tell the new job's coordinator this peer takes part
            return
        if plan is None:
            return
        stats: dict[str, float] = {}
        loss = None
        tokens = 0
        rnd = 0
        if w is not None:
            stats.update(w.stats())
            loss = w.last_loss
            tokens = w.tokens
            rnd = w.round
        elif last_state is not None and last_state.job_id == plan.job_id:
            rnd = last_state.round  # a spare's rounds of this job; of another job it has none (0)
        tstats = self.transport.stats
        sent = {dst: n - (base.sent_bytes.get(dst, 0) if base else 0) for dst, n in tstats.sent_bytes.items()}
        received = sum(tstats.recv_bytes.values()) - (sum(base.recv_bytes.values()) if base else 0)
        # bytes by destination region since the job started (probes before it excluded): the traffic matrix
        regions = {s.peer: s.region for pipe in plan.pipelines for s in pipe}
        by_region: dict[str, float] = {}
        for dst, n in sent.items():
            r = regions.get(dst)
            if r is not None:
                by_region[r] = by_region.get(r, 0.0) + n
        for region, total in list(by_region.items())[:16]:
            stats[f"to:{region}"] = float(total)
        # inbound messages the data plane refused, by reason: hostile or broken traffic shows up here
        for reason, count in sorted(tstats.dropped.items())[:16]:
            stats[f"drop:{reason}"] = float(count)
        if lost is not None:  # blocks with no reachable holder: the coordinator stops the job, naming them
            stats["lost_round"] = float(lost.round)
            runs: list[list[int]] = []
            for b in sorted(lost.blocks):  # as ranges of consecutive blocks, "lost:<start>-<end>"
                if runs and runs[-1][1] == b:
                    runs[-1][1] = b + 1
                else:
                    runs.append([b, b + 1])
            for a, b in runs[:6]:
                stats[f"lost:{a}-{b}"] = 1.0
        # links into this peer that its plan's traffic found limiting (it held their messages): the coordinator
        # compares them with what the plan assumed (a degraded link gets a replan). A link that keeps up has no
        # figure, so a healthy run adds nothing to the record.
        plan_peers = set(regions)
        links_in = {src: InboundLinkReport(bandwidth_bps=m.bandwidth_bps, messages=m.messages, queued=m.queued)
                    for src, m in sorted(self.transport.inbound_links().items())
                    if m.bandwidth_bps is not None and src in plan_peers}
        record = ProgressRecord(
            peer_id=self.peer_id,
            job_id=plan.job_id,
            plan_version=plan.version,
            step=step,
            loss=loss,
            tokens=tokens,
            round=rnd,
            bytes_sent=int(sum(sent.values())),
            bytes_received=int(received),
            updated_at=time.time(),
            stats=stats,
            status=status,
            shards=self._shards(plan.job_id),
            links_in=dict(list(links_in.items())[:8]),
        )
        period = self._liveness_s()
        ttl = self.swarm.config.liveness_ttl_s(period)
        try:
            self.swarm.publish_progress(record, ttl_s=ttl)
        except GeotrainError as e:
            logger.info("progress not published: %s", e)
        if self._digests is not None:
            self._digests.published(record, period_s=period, ttl_s=ttl)


def _curve_key(rec: PeerRecord) -> bytes | None:
    return rec.curve_public_key.encode() if rec.curve_public_key else None

