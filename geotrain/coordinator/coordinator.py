"""The coordinator: publishes a job, plans it on the live swarm, watches it, replans on churn, reports.

The coordinator holds no training state. Peers train from the plan on the DHT;
if the coordinator dies, they go on with the current plan until its stop
step. A restarted coordinator (same identity) reattaches: it reads the newest
plan version it published and carries on from there, never publishing the same
version twice.

The watch's rules (death, stall, join, link, restart step, stop, end) are the pure
:func:`geotrain.coordinator.decide.decide`; :meth:`Coordinator.run` reads the
swarm and carries out what it returns.

Replanning: a peer of the current plan whose record has expired is dead. The
coordinator waits ``replan_grace_s`` (a short blip is not a death), then plans
again on the live peers; the new version restarts every pipeline at the last
round boundary that all live peers have committed, so no round is applied
twice or half. A peer that joins is folded in at the next plan version (after
``join_grace_s``, so a burst of joiners costs one replan).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geotrain.config import JobSpec
from geotrain.coordinator.decide import (
    Action,
    Death,
    EndWatch,
    LinkDegraded,
    Memory,
    Missing,
    Policy,
    Replan,
    RequestStop,
    Stall,
    StateLost,
    View,
    decide,
    next_due,
)
from geotrain.coordinator.digests import cover
from geotrain.coordinator.planning import egress_price, make_plan, with_passive
from geotrain.coordinator.report import write_report
from geotrain.errors import GeotrainError, InfeasiblePlanError, SwarmError
from geotrain.plan import JobPlan
from geotrain.swarm import Swarm
from geotrain.swarm.news import JOB_NEWS, PLAN_NEWS, PROGRESS_NEWS, Contact, NewsWaiter, send_news, serve_news
from geotrain.swarm.probe_targets import probe_targets
from geotrain.swarm.records import JobRecord, PeerRecord, PeerStatus, PlanRecord, ProgressRecord
from geotrain.transport import Transport

logger = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, kw_only=True)
class CoordinatorConfig:
    job_id: str
    report_dir: Path
    poll_s: float = 2.0  # DHT reads while waiting for peers and links
    # DHT reads while the job runs, at most once per the job's liveness period (swarm.heartbeat_s), the pace its
    # progress records change at; peers' news of a stall or the end wakes the watch at once
    watch_every_s: float = 10.0
    peers_every_s: float = 30.0  # the peer records while the job runs (at once when a new peer reports progress)
    # every peer's own progress record, however well the region digests cover the plan (a digest is a hint: a
    # lying collector keeps a dead peer looking alive this long at most)
    full_read_every_s: float = 60.0
    replan_grace_s: float = 3.0
    stall_replan_s: float = 10.0  # a plan peer stalled (a neighbour failed it) this long gets a fresh plan
    join_grace_s: float = 5.0
    finish_timeout_s: float = 120.0
    links_wait_s: float = 30.0
    egress_usd_per_gb: dict[str, float] = field(default_factory=dict)
    evaluate: bool = True
    resume: bool = False  # start from the newest complete checkpoint: job.checkpoint.dir's, else the manifests'


@dataclass
class _Run:
    started: float
    plans: list[dict[str, Any]] = field(default_factory=list)
    loss: list[dict[str, Any]] = field(default_factory=list)
    validation: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    throughput: list[dict[str, Any]] = field(default_factory=list)
    seen_peers: dict[str, PeerRecord] = field(default_factory=dict)
    last_progress: dict[str, ProgressRecord] = field(default_factory=dict)
    in_plan_s: dict[str, float] = field(default_factory=dict)  # seconds each peer spent in a plan
    compute_s: dict[str, float] = field(default_factory=dict)
    seen_loss: set[tuple[str, int]] = field(default_factory=set)
    last_eval_step: int = 0
    tokens_by: dict[tuple[str, int], int] = field(default_factory=dict)  # (last-stage peer, plan version)


class Coordinator:
    """One job's coordinator. ``run()`` blocks until the job ends and returns the report dict."""

    def __init__(
        self,
        config: CoordinatorConfig,
        job: JobSpec,
        *,
        swarm: Swarm,
        transport: Transport | None = None,
        emit: Emit | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock  # the watch's timers (grace periods, the finish deadline); wall time only for reports
        self.job = job
        self.swarm = swarm
        self.transport = transport
        self._emit = emit or (lambda e: None)
        self._stop = threading.Event()
        self.plan: JobPlan | None = None
        self._run = _Run(started=time.time())
        # the watch loop reads progress every liveness period (or watch_every_s when shorter), or at once when a
        # peer sends news (done, stalled): reading faster than the records change only costs bytes
        self._progress_news = NewsWaiter(self._stop, poll_s=min(config.watch_every_s, job.swarm.heartbeat_s))
        self._manifests: Any = None  # ManifestBook of the peers' checkpoint shards, built on first use
        self._last_manifest: dict[str, Any] | None = None
        self._manifest_wire: dict[str, Any] | None = None  # the newest manifest's dict, published with the plan
        self._told: set[str] = set()  # peers this coordinator sent news of its job
        # links as the job's own traffic measured them, (src, dst) -> (bytes/s, when): they replace the probes'
        # figures in every later plan; the current plan's assumed figure per hop direction (decide's input)
        self._passive: dict[tuple[str, str], tuple[float, float]] = {}
        self._assumed: dict[tuple[str, str], float] = {}
        self._peers_read: tuple[float, dict[str, PeerRecord]] | None = None  # (when, the peer records then)
        self._full_read: tuple[float, dict[str, ProgressRecord]] | None = None  # (when, the progress records then)
        # the watch's reads: ticks that read the digests, those the digests covered, full reads of every record
        self.reads = {"digest": 0, "covered": 0, "full": 0}
        if transport is not None:
            serve_news(transport, PROGRESS_NEWS, self._progress_news)
        sw = job.swarm
        self._policy = Policy(replan_grace_s=config.replan_grace_s, stall_replan_s=config.stall_replan_s,
                              join_grace_s=config.join_grace_s, finish_timeout_s=config.finish_timeout_s,
                              link_degraded_ratio=sw.link_degraded_ratio, link_replan_s=sw.link_replan_s,
                              every=job.sync.every)

    def stop(self) -> None:
        self._stop.set()
        self._progress_news.poke()

    def _admit(self, peers: dict[str, PeerRecord]) -> None:
        """Closed swarm: the job's verified peers may reach this coordinator's data plane (their news)."""
        if self.transport is not None and self.transport.config.curve is not None:
            self.transport.allow_clients({r.curve_public_key.encode() for r in peers.values() if r.curve_public_key})

    def _announce(self, plan: JobPlan, previous: JobPlan | None = None) -> None:
        """News of a plan record just written (:func:`news_contacts` says to whom)."""
        if self.transport is None:
            return
        send_news(self.transport, news_contacts(plan, previous, self._run.seen_peers), PLAN_NEWS)

    def _until_due(self, memory: Memory) -> float | None:
        """Seconds until a timer of ``memory`` matures (:func:`next_due`), or None."""
        now = self._clock()
        due = next_due(memory, now, self._policy)
        return None if due is None else due - now

    def _read_view(self, *, every_replica: bool = False) -> tuple[dict[str, ProgressRecord], dict[str, PeerRecord]]:
        """This job's progress and the live peer records, read quietly.

        From the region digests (O(regions) records: :mod:`geotrain.swarm.digest`) laid over the last full
        read, when they cover every plan peer and spare and say nothing moved that only a peer's own record
        details; else, after news, with ``every_replica``, and every ``full_read_every_s``, from every peer's
        own record (:meth:`_read_full`).
        """
        now = self._clock()
        last = self._full_read
        if not (every_replica or self._progress_news.had_news or last is None or self._peers_read is None
                or now - last[0] >= self.config.full_read_every_s):
            assert self.plan is not None
            try:
                digests = self.swarm.get_digests()
            except GeotrainError as e:
                logger.info("DHT read of the region digests failed: %s", e)
                digests = {}
            self.reads["digest"] += 1
            if digests:
                everyone = self._peers_read[1]
                merged, why = cover(self.plan, digests, last[1])
                if why is None:
                    self.reads["covered"] += 1
                    return merged, everyone
                logger.debug("reading every progress record: %s", why)
        progress, everyone = self._read_full(every_replica=every_replica)
        self._full_read = (now, progress)
        self.reads["full"] += 1
        return progress, everyone

    def _read_full(self, *, every_replica: bool = False) -> tuple[dict[str, ProgressRecord], dict[str, PeerRecord]]:
        """This job's progress records and the live peer records, read quietly.

        First from one replica each (a fifth of the bytes of reading every replica); only when that
        copy lacks a record of a plan peer (a death, or a replica that missed a write) from every
        replica, so a peer is never taken for dead on one replica's word; after a peer's news, or with
        ``every_replica``, from every replica at once (a joiner's first record may be on replicas the quick copy
        is not). The progress records are the liveness signal and are read every tick; the peer records
        (endpoints, keys, compute: they change when a peer joins) only when a progress record names a peer the last copy lacks, or every
        ``peers_every_s``: half the coordinator's read bytes while nothing changes.
        """
        assert self.plan is not None
        plan_peers = set(self.plan.peers)
        # news (a peer stalled, done, or new to the job) is rare and may concern a record the quick copy lacks
        for thorough in (True,) if every_replica or self._progress_news.had_news else (False, True):
            progress = {pid: p for pid, p in self.swarm.get_progress(thorough=thorough).items()
                        if p.job_id == self.config.job_id}
            cached = self._peers_read
            if (thorough or cached is None or self._clock() - cached[0] > self.config.peers_every_s
                    or not set(progress) <= set(cached[1])):
                cached = self._peers_read = (self._clock(), self.swarm.get_peers(thorough=thorough))
            everyone = cached[1]
            if plan_peers <= set(progress) and plan_peers <= set(everyone):
                break
        return progress, everyone

    def _fresh_peers(self, peers: dict[str, PeerRecord], progress: dict[str, ProgressRecord]) -> dict[str, PeerRecord]:
        """``peers`` (this tick's live peers) with their records read anew, and any live peer the tick's copy
        lacked: a replan plans on the newest endpoints. A record the quick read misses keeps its older copy."""
        try:
            self._peers_read = (self._clock(), self.swarm.get_peers())
        except GeotrainError as e:
            logger.info("DHT read failed: %s", e)
            return peers
        fresh = {pid: rec for pid, rec in self._peers_read[1].items()
                 if pid in progress and progress[pid].status != PeerStatus.LEFT}
        return {**peers, **fresh}

    def _with_spares(self, peers: dict[str, PeerRecord]) -> dict[str, PeerRecord]:
        """``peers`` plus the current plan's spares that a quick read missed, read again from every replica.

        The quick view is re-read thoroughly only for missing *placed* peers (a spare that died costs no
        replan); before a replan the spares matter too: planned without one, the new plan cannot use it.
        """
        assert self.plan is not None
        if all(s in peers for s in self.plan.spares):
            return peers
        try:
            progress = {pid: p for pid, p in self.swarm.get_progress(thorough=True).items()
                        if p.job_id == self.config.job_id}
            everyone = self.swarm.get_peers(thorough=True)
        except GeotrainError as e:
            logger.info("DHT read failed: %s", e)
            return peers
        found = {pid: everyone[pid] for pid in self.plan.spares
                 if pid not in peers and pid in everyone and pid in progress
                 and progress[pid].status != PeerStatus.LEFT}
        return {**peers, **found}

    def _tell_job(self, peers: dict[str, PeerRecord]) -> None:
        """News of the job to each peer seen for the first time: it reads the job now, not at its next poll.

        (Peers poll for jobs slowly: the control plane stays quiet. A peer behind NAT, or one whose closed
        swarm's allow-list does not have this coordinator yet, misses the news and finds the job at its poll.)
        """
        if self.transport is None:
            return
        new = [Contact(pid, rec.endpoint, rec.region or None, rec.curve_public_key)
               for pid, rec in peers.items() if pid not in self._told and rec.endpoint.startswith("tcp://")]
        self._told.update(peers)
        if new:
            send_news(self.transport, new, JOB_NEWS)

    def _t(self) -> float:
        return time.time() - self._run.started

    def _event(self, kind: str, **fields: Any) -> None:
        e = {"t_s": round(self._t(), 3), "kind": kind, **fields}
        self._run.events.append(e)
        self._emit({"event": kind, **fields})

    # -- phases -----------------------------------------------------------------------------------
    def publish_job(self) -> None:
        adm = self.swarm.admission
        rec = JobRecord(
            job_id=self.config.job_id,
            spec=self.job.to_dict(),
            published_at=time.time(),
            curve_public_key=None if adm is None else adm.curve_public_key,
            admission=None if adm is None else adm.own_proof(self.swarm.peer_id),
            endpoint=None if self.transport is None else self.transport.address,
            plan_version=None if self.plan is None else self.plan.version,
            plan_stop_step=None if self.plan is None else self.plan.stop_step,
        )
        self.swarm.publish_job(rec)

    def _move_pointer(self) -> None:
        """Republish the job record with the new plan's version pointer (peers read the plan when it moved)."""
        try:
            self.publish_job()
        except GeotrainError as e:  # news told the plan's peers already; the next re-publish moves it
            logger.info("job record with the new plan version not published: %s", e)

    def wait_for_peers(self) -> dict[str, PeerRecord]:
        """Block until ``swarm.min_peers`` live peers have published links to each other."""
        need = self.job.swarm.min_peers
        deadline = time.monotonic() + self.job.swarm.wait_peers_s
        links_since: float | None = None
        while not self._stop.is_set():
            everyone = self.swarm.get_peers()
            self._tell_job(everyone)
            peers = self._takers(everyone)
            self._admit(peers)
            for pid, rec in peers.items():
                if pid not in self._run.seen_peers:  # once per run, not once per planning attempt
                    self._run.seen_peers[pid] = rec
                    self._event("join", peer_id=pid, region=rec.region, device=rec.device, tflops=rec.flops / 1e12)
            if len(peers) >= need:
                links = self.swarm.get_links()
                regions = {pid: rec.region for pid, rec in peers.items()}
                started = {pid: rec.started_at for pid, rec in peers.items()}
                dial_out = {pid for pid, rec in peers.items() if rec.dial_back}
                complete = all(  # every peer measured its probe targets (not every pair: probe_targets)
                    pid in links and set(probe_targets(pid, regions, started=started, dial_out=dial_out))
                    <= set(links[pid].links)
                    for pid in peers
                )
                links_since = links_since or time.monotonic()
                if complete or time.monotonic() - links_since > self.config.links_wait_s:
                    return peers
            if time.monotonic() > deadline:
                raise SwarmError(
                    f"only {len(peers)} of the {need} peers this job needs (swarm.min_peers) joined within "
                    f"{self.job.swarm.wait_peers_s:.0f}s; start more `geotrain peer`s or lower swarm.min_peers"
                )
            self._stop.wait(self.config.poll_s)
        raise SwarmError("stopped while waiting for peers")

    def _first_plan(self, resume: int | None) -> None:
        """Plan v1 once enough peers are here; retry while links are still being measured."""
        deadline = time.monotonic() + self.job.swarm.wait_peers_s
        told = None
        while True:
            peers = self.wait_for_peers()
            try:
                self.publish_plan(peers, start_step=resume or 0, reason="resume" if resume else "initial",
                                  resume_step=resume)
                return
            except InfeasiblePlanError as e:
                if time.monotonic() > deadline or self._stop.is_set():
                    raise
                if str(e) != told:  # the user sees why nothing trains yet, once per reason, not after the wait
                    told = str(e)
                    self._event("waiting", reason=told, peers=len(peers),
                                wait_s=round(max(0.0, deadline - time.monotonic()), 1))
                logger.info("not plannable yet (%s); waiting for more link measurements", e)
                self._stop.wait(self.config.poll_s * 2)

    def _takers(self, peers: dict[str, PeerRecord]) -> dict[str, PeerRecord]:
        """The live peers that follow this job: they publish progress for it (idle until a plan names them).

        A peer of the same swarm that follows another job (``geotrain peer --job``) is never planned.
        """
        following = {pid for pid, p in self.swarm.get_progress().items() if p.job_id == self.config.job_id}
        return {pid: rec for pid, rec in peers.items() if pid in following}

    def _next_version(self) -> int:
        mine = self.swarm.latest_plan(job_id=self.config.job_id, publisher=self.swarm.peer_id)
        # above any live plan of this job id, whoever published it: a fresh coordinator resuming the job must
        # not publish a version its peers already hold from the previous coordinator (they would ignore it)
        anyone = self.swarm.latest_plan(job_id=self.config.job_id)
        return max(mine.version if mine else 0, anyone.version if anyone else 0,
                   self.plan.version if self.plan else 0) + 1

    def publish_plan(
        self, peers: dict[str, PeerRecord], *, start_step: int, reason: str, resume_step: int | None = None,
        state_step: int | None = None,
    ) -> JobPlan:
        links = with_passive(self.swarm.get_links(), self._passive)
        version = self._next_version()
        plan, planner_json = make_plan(
            self.job,
            self.config.job_id,
            version=version,
            peers=peers,
            links=links,
            start_step=start_step,
            state_step=state_step,
            stop_step=self.job.stop.steps,
            resume_step=resume_step,
            egress_usd_per_gb=self.config.egress_usd_per_gb,
        )
        self.swarm.publish_plan(
            PlanRecord(job_id=self.config.job_id, version=version, plan=self._plan_wire(plan), published_at=time.time())
        )
        previous, self.plan = self.plan, plan
        self._assumed = _fair_shares(plan, planner_json.get("hop_bandwidth_bps", []))
        self._announce(plan, previous)
        self._move_pointer()
        self._run.plans.append(
            {
                "version": version,
                "t_s": round(self._t(), 3),
                "reason": reason,
                "pipelines": plan.to_dict()["pipelines"],
                "spares": list(plan.spares),
                "predicted": dict(plan.predicted),
                "baselines": planner_json.get("baselines", {}),
                "start_step": start_step,
                "state_step": plan.state_floor,
            }
        )
        layout = [" -> ".join(f"{s.region}[{s.start}:{s.end})" for s in pipe) for pipe in plan.pipelines]
        # pairs nobody probed (geotrain.swarm.probe_targets) were priced by their regions' measured pairs
        measured = {frozenset((src, dst)) for src, row in links.items() for dst in row.links if src in peers}
        pairs = len(peers) * (len(peers) - 1) // 2
        link_counts = {"measured": sum(1 for p in measured if len(p) == 2 and p <= set(peers))}
        link_counts["estimated"] = pairs - link_counts["measured"]
        self._run.plans[-1]["links"] = link_counts
        self._event("replan" if version > 1 else "plan", version=version, reason=reason,
                    pipelines=len(plan.pipelines), stages=[len(p) for p in plan.pipelines],
                    layout=layout, spares=len(plan.spares), links=link_counts, start_step=plan.start_step,
                    state_step=plan.state_floor, predicted_tokens_per_s=plan.predicted.get("tokens_per_s"))
        return plan

    def _resume_step(self) -> int | None:
        """With ``resume``: the newest complete checkpoint's step (CheckpointError if there is none): of the
        shared ``checkpoint.dir`` when the job names one, else of the newest manifest in the report directory
        (the peers hold the tensors), else of the DHT's copy beside a plan record, else one rebuilt from the
        shards the peers report holding (a DHT record lives only on the nodes that stored it: when they all
        died, the holders still know what they hold)."""
        if not self.config.resume:
            return None
        from geotrain.errors import CheckpointError
        from geotrain.peers.checkpoint import latest_complete

        num_blocks = self.job.model.block_model(self.job.job.seed).num_blocks
        if not self.job.checkpoint.dir:
            from geotrain.coordinator.manifest import latest_manifest, manifest_dir

            m = latest_manifest(self.config.report_dir, self.config.job_id, num_blocks)
            source = str(manifest_dir(self.config.report_dir))
            # the DHT: a node that just joined may not see every record at its first read; read again, bounded;
            # the peers' reports once min_peers of them reported (or the DHT had its 30 s), while peers come
            t0 = time.monotonic()
            while m is None and not self._stop.is_set():
                m, source = self._dht_manifest(num_blocks), "dht"
                if m is None:
                    from_peers, reporters = self._peers_manifest(num_blocks)
                    if reporters >= self.job.swarm.min_peers or time.monotonic() - t0 > 30.0:
                        m, source = from_peers, "peers"
                if m is not None or time.monotonic() - t0 > self.job.swarm.wait_peers_s:
                    break
                self._stop.wait(self.config.poll_s)
            if m is None:
                raise CheckpointError(f"no checkpoint manifest of job {self.config.job_id} covering all "
                                      f"{num_blocks} blocks under {manifest_dir(self.config.report_dir)}; "
                                      "(nor on the DHT, nor reported by a peer's state directory); start without "
                                      "--resume, or pass the report directory of the first run")
            self._event("resume", manifest=source, step=m.step, round=m.round,
                        plan_version=m.plan_version, holders=sorted({p for sh in m.shards for p in sh.holders}))
            return m.step
        root = Path(self.job.checkpoint.dir or "")
        step = latest_complete(root, num_blocks)
        if step is None:
            raise CheckpointError(f"no complete checkpoint under {root} (each step-*/ needs entries covering all "
                                  f"{num_blocks} blocks); start without --resume")
        self._event("resume", checkpoint=str(root), step=step)
        return step

    def reattach(self) -> JobPlan | None:
        """Pick up the newest plan this coordinator published (after a restart)."""
        rec = self.swarm.latest_plan(job_id=self.config.job_id, publisher=self.swarm.peer_id)
        if rec is None:
            return None
        self.plan = JobPlan.from_dict(rec.plan)
        self._run.plans.append({"version": self.plan.version, "t_s": 0.0, "reason": "reattach",
                                "pipelines": rec.plan.get("pipelines", []), "spares": list(self.plan.spares),
                                "predicted": dict(self.plan.predicted), "start_step": self.plan.start_step})
        self._event("reattach", version=self.plan.version)
        return self.plan

    # -- the watch loop ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Publish, plan, then watch: each tick reads the swarm and carries out what :func:`decide` says."""
        self._event("start", job_id=self.config.job_id)
        self.publish_job()
        if self.reattach() is None:
            resume = self._resume_step()
            self._first_plan(resume)
        assert self.plan is not None
        last_job_publish = self._clock()
        memory = Memory()
        last_tick = time.time()
        # a pending timer (a joiner's grace, a missing peer's) brings the next tick forward to when it matures
        while self._progress_news.wait(self._until_due(memory)):
            now = time.time()
            dt, last_tick = now - last_tick, now
            if self._clock() - last_job_publish > self.swarm.config.record_ttl_s / 3:
                try:
                    self.publish_job()
                    plan_rec = PlanRecord(job_id=self.config.job_id, version=self.plan.version,
                                          plan=self._plan_wire(self.plan), published_at=time.time())
                    self.swarm.publish_plan(plan_rec)
                    last_job_publish = self._clock()
                except GeotrainError as e:  # tried again next poll; a stopping job still writes its report
                    logger.info("DHT write failed: %s", e)
            try:
                # a joiner waiting out its grace is read from every replica: a quick copy that lacks it would
                # start the grace again
                progress, everyone = self._read_view(every_replica=memory.joiner_since is not None)
                self._tell_job(everyone)
                # a peer is alive while its progress is; one that says it left is gone now
                peers = {pid: rec for pid, rec in everyone.items()
                         if pid in progress and progress[pid].status != PeerStatus.LEFT}
                self._admit(peers)
            except GeotrainError as e:
                logger.info("DHT read failed: %s", e)
                continue
            self._account(peers, progress, dt)
            self._record_manifests(progress)
            self._maybe_evaluate(progress)
            self._keep_passive(progress)
            view = View(plan=self.plan, progress=progress, live=frozenset(peers), joiners=self._joiners(peers),
                        assumed=self._assumed, limit_reached=self._stop_reached())
            memory, actions = decide(memory, view, self._clock(), self._policy)
            if self._carry_out(actions, peers, progress, everyone):
                break
        return self.finish()

    def _carry_out(self, actions: list[Action], peers: dict[str, PeerRecord], progress: dict[str, ProgressRecord],
                   everyone: dict[str, PeerRecord]) -> bool:
        """Carry out one tick's actions in order; True when the watch ends."""
        assert self.plan is not None
        for a in actions:
            if isinstance(a, Missing):
                logger.info("plan peer %s missing from the view (progress record: %s, peer record: %s)",
                            a.peer, a.peer in progress, a.peer in everyone)
            elif isinstance(a, Death):
                self._event("death", peer_id=a.peer)
            elif isinstance(a, Stall):
                self._event("stall", peers=list(a.peers))
            elif isinstance(a, LinkDegraded):
                self._event("link", **dataclasses.asdict(a))
            elif isinstance(a, Replan):
                try:
                    live = self._with_spares(self._fresh_peers(peers, progress))
                    self.publish_plan(live, start_step=a.start_step, state_step=a.state_step, reason=a.reason,
                                      resume_step=a.resume_step)
                except GeotrainError as e:  # no plannable peer, a failed write: the plan stands, tried again
                    self._event("error", message=f"cannot replan: {e}")
            elif isinstance(a, StateLost):
                blocks = list(a.blocks)
                self._event("error", kind_of="state_lost", blocks=blocks, round=a.round,
                            message=f"blocks {blocks} have no reachable holder at round {a.round} (no live peer, "
                                    "no peer's state directory): the job stops; restart the peers that hold them "
                                    "and resume, or set checkpoint.allow_seed_restart = true")
            elif isinstance(a, RequestStop):
                self._request_stop(a.stop_step)
            elif isinstance(a, EndWatch):
                if a.reason == "finish_timeout":
                    self._event("error", message="peers did not report done before the finish timeout")
                return True
        return False

    def _joiners(self, peers: dict[str, PeerRecord]) -> frozenset[str]:
        """Live peers outside the plan and its spares whose probe targets are measured (they can be placed).

        Spares were placed, or left out, with their links already: only a true joiner needs the link rows.
        A joiner is announced (a ``join`` event) the first time it is seen.
        """
        assert self.plan is not None
        plan_peers = set(self.plan.peers)
        outside = [p for p in peers if p not in plan_peers and p not in self.plan.spares]
        if not outside:
            return frozenset()
        try:
            rows = self.swarm.get_links()
        except GeotrainError as e:  # no joiner this tick; the next read finds them
            logger.info("DHT read failed: %s", e)
            return frozenset()
        regions = {pid: rec.region for pid, rec in peers.items()}
        started = {pid: rec.started_at for pid, rec in peers.items()}
        dial_out = {pid for pid, rec in peers.items() if rec.dial_back}
        joiners = frozenset(p for p in outside if p in rows and set(
            probe_targets(p, regions, started=started, dial_out=dial_out)) <= set(rows[p].links))
        for p in sorted(joiners):
            if p not in self._run.seen_peers:
                self._run.seen_peers[p] = peers[p]
                self._event("join", peer_id=p, region=peers[p].region, device=peers[p].device)
        return joiners

    def _keep_passive(self, progress: dict[str, ProgressRecord]) -> None:
        """Keep every link figure the job's own traffic measured (``ProgressRecord.links_in``): it prices the
        link in every later plan."""
        for dst, record in progress.items():
            for src, report in record.links_in.items():
                self._passive[(src, dst)] = (report.bandwidth_bps, record.updated_at)

    def _account(self, peers: dict[str, PeerRecord], progress: dict[str, ProgressRecord], dt: float) -> None:
        assert self.plan is not None
        r = self._run
        for pid in self.plan.peers:
            if pid in peers:
                r.in_plan_s[pid] = r.in_plan_s.get(pid, 0.0) + dt
        fresh = []
        for pid, pr in progress.items():
            r.last_progress[pid] = pr
            if pr.loss is not None:
                # tokens trained: each pipeline's last stage counts its own, per plan version (a rebuilt
                # worker counts from zero again)
                key = (pid, pr.plan_version)
                r.tokens_by[key] = max(r.tokens_by.get(key, 0), pr.tokens)
                if (pid, pr.step) not in r.seen_loss:
                    r.seen_loss.add((pid, pr.step))
                    fresh.append(pr)
        tokens = sum(r.tokens_by.values())
        for pr in fresh:
            r.loss.append({"t_s": round(self._t(), 3), "step": pr.step, "tokens": tokens, "loss": pr.loss,
                           "peer": pr.peer_id})
        r.throughput.append({"t_s": round(self._t(), 3), "tokens": tokens})
        if len(r.throughput) > 1:
            a, b = r.throughput[-2], r.throughput[-1]
            b["tokens_per_s"] = max(0.0, (b["tokens"] - a["tokens"]) / max(b["t_s"] - a["t_s"], 1e-9))
        else:
            r.throughput[-1]["tokens_per_s"] = 0.0
        self._emit({"event": "progress", "t_s": round(self._t(), 1), "tokens": tokens,
                    "peers": {pid: {"step": p.step, "loss": p.loss, "round": p.round,
                                    "status": p.status.value} for pid, p in r.last_progress.items()},
                    "watch_reads": dict(self.reads)})

    def _plan_wire(self, plan: JobPlan) -> dict[str, Any]:
        """A plan's DHT form, with the newest checkpoint manifest beside it (what a fresh coordinator reads when
        it has no report directory, while the record lives)."""
        d = plan.to_dict()
        if self._manifest_wire is not None:
            d["manifest"] = self._manifest_wire
        return d

    def _dht_manifest(self, num_blocks: int) -> Any:
        """The newest manifest of this job found beside a live plan record on the DHT (any publisher), or None."""
        from geotrain.coordinator.manifest import Manifest

        found = []
        for rec in self.swarm.get_plans().values():
            raw = rec.plan.get("manifest")
            if rec.job_id != self.config.job_id or not isinstance(raw, dict):
                continue
            try:
                m = Manifest.from_dict(raw)
            except GeotrainError:
                continue
            if m.job_id == self.config.job_id and m.covers(num_blocks):
                found.append(m)
        return max(found, key=lambda m: m.step, default=None)

    def _peers_manifest(self, num_blocks: int) -> tuple[Any, int]:
        """The newest manifest the live peers' reported shards cover whole (or None), and how many peers of
        this job reported shards."""
        from geotrain.coordinator.manifest import ManifestBook

        book = ManifestBook(self.config.job_id, num_blocks)
        reporters = 0
        for pid, pr in self.swarm.get_progress().items():
            if pr.job_id == self.config.job_id and pr.shards:
                book.add(pid, pr.plan_version, pr.shards)
                reporters += 1
        return book.newest(), reporters

    def _record_manifests(self, progress: dict[str, ProgressRecord]) -> None:
        """The peers' reported checkpoint shards: a manifest for each step they now cover whole (or anew)."""
        from geotrain.coordinator.manifest import ManifestBook, countable_shards, write_manifest

        if self._manifests is None:
            self._manifests = ManifestBook(self.config.job_id, self.job.model.block_model(self.job.job.seed).num_blocks)
        plan = self.plan
        for pid, pr in progress.items():
            shards = pr.shards if plan is None else countable_shards(
                pr.shards, placed=pid in plan.peers, current=pr.plan_version == plan.version,
                start_step=plan.start_step)
            self._manifests.add(pid, pr.plan_version, shards)
        for m in self._manifests.changed():
            try:
                path = write_manifest(self.config.report_dir, m)
            except GeotrainError as e:
                self._event("error", message=str(e))
                continue
            self._manifests.written(m)
            if self._last_manifest is None or self._last_manifest["step"] <= m.step:  # an older step rewritten
                self._last_manifest = {"path": str(path), "step": m.step, "round": m.round}
            if self._manifest_wire is None or int(self._manifest_wire["step"]) <= m.step:
                self._manifest_wire = m.to_dict()
                if self.plan is not None:  # the plan record carries it on the DHT (else: at the next re-publish)
                    try:
                        self.swarm.publish_plan(PlanRecord(job_id=self.config.job_id, version=self.plan.version,
                                                           plan=self._plan_wire(self.plan), published_at=time.time()))
                    except GeotrainError as e:
                        logger.info("publishing manifest step %d with the plan failed: %s", m.step, e)
            self._event("manifest", path=str(path), step=m.step, round=m.round,
                        shards=[{"blocks": [sh.start, sh.end], "holders": sh.holders} for sh in m.shards])

    def _maybe_evaluate(self, progress: dict[str, ProgressRecord]) -> None:
        """Every ``report.eval_every`` steps: validation loss of the global model, assembled from the groups."""
        every = self.job.report.eval_every
        if every <= 0 or self.transport is None or self.plan is None:
            return
        steps = [p.step for pid, p in progress.items() if pid in set(self.plan.peers)]
        if len(steps) < len(self.plan.peers):
            return
        reached = min(steps) // every * every
        if reached <= self._run.last_eval_step or reached == 0:
            return
        self._run.last_eval_step = reached
        from geotrain.coordinator.evaluate import fetch_global, validation_loss

        try:
            # one try: a skipped periodic row costs less than a watch loop held up
            state = fetch_global(self.job, self.plan, self.transport, timeout=self.job.swarm.round_timeout_s,
                                 attempts=1)
            loss = validation_loss(self.job, state.params)
        except GeotrainError as e:
            logger.info("evaluation at step %d skipped: %s", reached, e)
            return
        tokens = self._run.throughput[-1]["tokens"] if self._run.throughput else 0
        self._run.validation.append({"t_s": round(self._t(), 3), "step": state.step, "round": state.round,
                                     "tokens": tokens, "loss": loss, "source": "global"})
        self._emit({"event": "validation", "step": state.step, "round": state.round, "loss": loss})

    def _stop_reached(self) -> bool:
        """A token, wall-time or budget limit of the job is reached (each only when the job sets it)."""
        s = self.job.stop
        tokens = self._run.throughput[-1]["tokens"] if self._run.throughput else 0
        if s.tokens is not None and tokens >= s.tokens:
            return True
        if s.wall_s is not None and self._t() >= s.wall_s:
            return True
        return s.usd is not None and self._usd()["total"] >= s.usd

    def _request_stop(self, stop_at: int) -> None:
        """Stop early (tokens / wall time / budget): the same plan version, its stop step at ``stop_at``.

        The plan's structure does not change, so peers only move their stop;
        nothing is rebuilt and no step is trained twice. A failed write leaves the plan as it was: the next
        tick asks again.
        """
        assert self.plan is not None
        new = dataclasses.replace(self.plan, stop_step=stop_at)
        try:
            self.swarm.publish_plan(PlanRecord(job_id=self.config.job_id, version=new.version,
                                               plan=self._plan_wire(new), published_at=time.time()))
        except GeotrainError as e:
            logger.info("stop at step %d not published: %s", stop_at, e)
            return
        self.plan = new
        self._announce(new)
        self._move_pointer()
        self._event("stop", version=new.version, stop_step=stop_at)

    # -- money and the report ---------------------------------------------------------------------
    def _usd(self) -> dict[str, Any]:
        r = self._run
        per_peer = {pid: r.in_plan_s.get(pid, 0.0) / 3600 * rec.usd_per_hour for pid, rec in r.seen_peers.items()}
        egress = 0.0
        pairs = self._bytes_by_region_pair()
        for key, n in pairs.items():
            a, b = key.split("->")
            if a != b:
                egress += n / 1e9 * egress_price(self.config.egress_usd_per_gb, a)
        compute = sum(per_peer.values())
        return {"compute": compute, "egress": egress, "total": compute + egress, "per_peer": per_peer}

    def _bytes_by_region_pair(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, pr in self._run.last_progress.items():
            src = self._run.seen_peers.get(pid)
            if src is None:
                continue
            for k, v in pr.stats.items():
                if k.startswith("to:"):
                    key = f"{src.region}->{k[3:]}"
                    out[key] = out.get(key, 0.0) + v
        return out

    def _write_model(self, state: Any) -> None:
        """The final global model into the run directory (``geotrain export`` reads it), exported when asked."""
        from geotrain.coordinator.artifacts import export_run, write_run_model

        try:
            path = write_run_model(self.config.report_dir, self.job, state)
            self._event("model", path=str(path), step=state.step, round=state.round)
            if self.job.report.export:
                out = export_run(self.config.report_dir, self.config.report_dir / "export")
                self._event("export", path=str(out))
        except (GeotrainError, OSError) as e:
            self._event("error", message=f"writing the final model failed: {e}")

    def finish(self) -> dict[str, Any]:
        r = self._run
        wall = self._t()
        tokens = r.throughput[-1]["tokens"] if r.throughput else 0
        if self.config.evaluate and self.plan is not None and self.transport is not None:
            from geotrain.coordinator.evaluate import final_row, initial_row

            final: list[Any] = []
            rows = [initial_row(self.job)]  # kept when the final state cannot be fetched
            try:
                rows.append(final_row(self.job, self.plan, self.transport, t_s=round(wall, 3), tokens=tokens,
                                      keep=final))
            except GeotrainError as e:
                self._event("error", message=f"final evaluation failed: {e}")
            # the final global model was evaluated already when the stop step was an eval step: once is enough
            periodic = [v for v in r.validation
                        if all((v["step"], v["round"]) != (f["step"], f["round"]) for f in rows[1:])]
            r.validation = [rows[0], *periodic, *rows[1:]]
            if final:
                self._write_model(final[0])
        pairs = self._bytes_by_region_pair()
        cross = sum(v for k, v in pairs.items() if k.split("->")[0] != k.split("->")[1])
        usd = self._usd()
        util = {
            pid: min(1.0, pr.stats.get("compute_s", 0.0) / max(r.in_plan_s.get(pid, 0.0), 1e-9))
            for pid, pr in r.last_progress.items()
        }
        val = [v for v in r.validation if v.get("loss") is not None]
        summary = {
            "job_id": self.config.job_id,
            "wall_s": round(wall, 2),
            "tokens": tokens,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "plan_versions": len(r.plans),
            "rounds": min((p.round for pid, p in r.last_progress.items()
                           if self.plan is not None and pid in set(self.plan.peers)), default=0),
            "deaths": sum(1 for e in r.events if e["kind"] == "death"),
            "train_loss_first": r.loss[0]["loss"] if r.loss else None,
            "train_loss_last": r.loss[-1]["loss"] if r.loss else None,
            "val_loss_initial": val[0]["loss"] if val else None,
            # the global model's last evaluation: None when none was fetched (the seed's loss is not a final one)
            "val_loss_final": next((v["loss"] for v in reversed(val) if v.get("source") != "init"), None),
            "cross_region_bytes": cross,
            "total_bytes": sum(pr.bytes_sent for pr in r.last_progress.values()),
            "usd_total": usd["total"],
            "usd_per_mtok": usd["total"] / (tokens / 1e6) if tokens else math.nan,
            "predicted_tokens_per_s": self.plan.predicted.get("tokens_per_s") if self.plan else None,
        }
        report = {
            "job": self.job.to_dict(),
            "started_at": r.started,
            "finished_at": time.time(),
            "wall_s": wall,
            "peers": [
                {"peer_id": pid, "region": rec.region, "device": rec.device, "tflops": rec.flops / 1e12,
                 "usd_per_hour": rec.usd_per_hour}
                for pid, rec in r.seen_peers.items()
            ],
            "plans": r.plans,
            "loss": r.loss,
            "validation": r.validation,
            "throughput": {"tokens": tokens, "tokens_per_s": summary["tokens_per_s"], "samples": r.throughput},
            "utilisation": util,
            "peer_stats": {pid: {**pr.stats, "in_plan_s": round(r.in_plan_s.get(pid, 0.0), 3)}
                           for pid, pr in r.last_progress.items()},
            "bytes": {"by_region_pair": pairs, "cross_region": cross, "total": summary["total_bytes"]},
            "usd": usd,
            "events": r.events,
            "checkpoints": {"dir": self.job.checkpoint.dir, "manifest": self._last_manifest,
                            "last_round": max((p.round for p in r.last_progress.values()), default=0)},
            # the watch's ticks: read the region digests / covered by them / read every peer's own record
            "control_plane": {"watch_reads": dict(self.reads)},
            "summary": summary,
        }
        path = write_report(self.config.report_dir, report)
        self._emit({"event": "report", "path": str(path), "summary": summary})
        return report


def news_contacts(plan: JobPlan, previous: JobPlan | None, records: dict[str, PeerRecord]) -> list[Contact]:
    """Whom the news of ``plan`` goes to: its peers, its spares, and the ``previous`` plan's peers.

    A peer the new plan moved out of the pipelines (a spare now, or not in the plan at all) must hear too:
    until it reads the plan it trains on under the old one, and the new plan's members may be pulling their
    state from it. Spares are reached through their peer records (``records``); a plan slot carries its own.
    """
    contacts: dict[str, Contact] = {}
    for p in (plan, previous):
        for sl in (sl for pipe in (p.pipelines if p is not None else ()) for sl in pipe):
            if sl.endpoint and sl.peer not in contacts:
                contacts[sl.peer] = Contact(sl.peer, sl.endpoint, sl.region or None, sl.curve_public_key)
    for pid in plan.spares:
        rec = records.get(pid)
        if pid not in contacts and rec is not None and rec.endpoint:
            contacts[pid] = Contact(pid, rec.endpoint, rec.region or None, rec.curve_public_key)
    return list(contacts.values())


def _fair_shares(plan: JobPlan, hops: list[list[Any]]) -> dict[tuple[str, str], float]:
    """What the plan assumed for each hop direction (bytes/s), as its share of the link: the hops of the plan
    that go from one region to another split that region pair's link (probes measure one flow alone; a
    region's egress, a shared uplink or an emulated region link then carries several at once)."""
    region = {sl.peer: sl.region for pipe in plan.pipelines for sl in pipe}
    pairs: dict[tuple[str, str], int] = {}
    for a, b, _ in hops:
        ra, rb = region.get(a, ""), region.get(b, "")
        if ra != rb:
            pairs[(ra, rb)] = pairs.get((ra, rb), 0) + 1
    out = {}
    for a, b, bps in hops:
        ra, rb = region.get(a, ""), region.get(b, "")
        out[(a, b)] = float(bps) / (pairs.get((ra, rb), 1) if ra != rb else 1)
    return out
