"""One peer's part of one plan version: its stage, its pipeline runtime, its stage-group syncs.

Built when a peer adopts a plan. Where the initial (global) weights come from, in order:

1. the peer's own global state from the previous plan, when it covers this stage;
2. the shared checkpoint directory named by the plan (``--resume DIR``), for a peer new to the job;
3. for a peer holding nothing of the job yet past step 0: its own state directory's checkpoint of the plan's
   resume (or start) step (:class:`~geotrain.peers.statestore.StateStore`, verified);
4. the plan's other peers (:func:`~geotrain.sync.state.fetch_state`): those that
   held these blocks in the previous plan first, then the fastest measured
   links; every reply verified by size and SHA-256; pieces gathered from several;
   on a resume only state of the resume step, served from memory or the donors' state directories;
   otherwise no state stamped before the plan's start step (*stale*: what a spare kept from a plan it
   sat out). A peer new to the job (no previous plan to find the holders in) asks the plan's spares
   last: the holders a join replan left out are spares now. Own state is stale too when this peer sat
   out the previous plan: it is fetched instead;
5. the job's ``checkpoint.remote``, when no live peer holds them (verified like any shard);
6. the seed, only for a fresh job (step 0: every member builds identical weights without shipping
   them). Past step 0, blocks no reachable peer (nor the remote) holds stop this peer with a
   :class:`~geotrain.errors.StateTransferError` naming the blocks and the round, unless the job sets
   ``checkpoint.allow_seed_restart`` (then they restart from the seed, logged).

Peer-held checkpoints: after every ``checkpoint.every_rounds`` rounds the worker copies its global state
(:meth:`StageWorker.state` clones) and hands it to its store, which writes one shard per stage group on
its own thread; ``checkpoint_s`` counts only the step thread's part (the copy, and a wait when the
previous checkpoint is still being written). A checkpoint holds the group's global state and this peer's
*local* state (:class:`~geotrain.sync.state.StageState`): its error-feedback residuals and its inner
optimizer's moments, so a peer resumed from its own state directory at the same place in the plan
(pipeline, number of pipelines, stage) continues bit-identically; the data position is the step itself.
The first member of each stage group (its leader) also uploads the group's shard to ``checkpoint.remote``.

Inner weights start equal to the global ones. The inner optimizer (AdamW) starts fresh with each plan
version of a running swarm (its moments are local and cheap to rebuild), except on a resume from this
peer's own checkpoint at the same place, where its moments and residuals are restored.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from geotrain.config import JobSpec
from geotrain.data.job import dataset_for
from geotrain.errors import CheckpointError, ConfigError, StateLostError, StateTransferError
from geotrain.models import build_stage
from geotrain.peers.probe import answering
from geotrain.peers.statestore import StateStore
from geotrain.pipeline import StageConfig, StageRuntime
from geotrain.pipeline.lr import LRSchedule
from geotrain.pipeline.optim import is_fused
from geotrain.plan import JobPlan, SyncGroup
from geotrain.swarm.records import LinkMeasurement
from geotrain.sync import DiLoCoConfig, DiLoCoSync, GroupRouter, Member, StaticMembership
from geotrain.sync.state import StageState, block_of, digest, fetch_state, state_heads
from geotrain.transport import Transport

logger = logging.getLogger(__name__)


@dataclass
class _AppliedStep:
    """An inner step whose optimizer step is applied but which has not committed yet (see ``step``)."""

    step: int
    metrics: Any
    synced: set[int] = field(default_factory=set)  # indices of the syncs done after it


class StageWorker:
    """Runs inner steps of this peer's stage under one plan; see the module docstring.

    Thread ownership: the agent's main thread calls ``step``/``finish``/``close``; ``state()`` is also
    called from the transport's handler pool and reads the global state under ``_commit_lock``.
    """

    def __init__(
        self,
        job: JobSpec,
        plan: JobPlan,
        *,
        peer_id: str,
        transport: Transport,
        previous_state: StageState | None = None,
        previous_plan: JobPlan | None = None,
        links: dict[str, LinkMeasurement] | None = None,
        device: str = "cpu",
        router: GroupRouter | None = None,
        store: StateStore | None = None,
        spares: tuple[str, ...] = (),
        local: Any = None,
    ) -> None:
        slot_at = plan.slot_of(peer_id)
        if slot_at is None:
            raise ValueError(f"peer {peer_id} has no stage in plan v{plan.version}")
        self.job, self.plan, self.peer_id, self.transport = job, plan, peer_id, transport
        p, s = slot_at
        pipe = plan.pipelines[p]
        slot = pipe[s]
        self.pipeline, self.stage_index = p, s
        seed = job.job.seed
        self.device = torch.device(device)
        self.stage = build_stage(job.model.block_model(seed), slot.layers, seed).to(self.device)
        if local is not None:  # the peer's other local ranks build their copies (geotrain.peers.ranks)
            local.build(job.model, slot.layers, seed, self.stage, compute_dtype=job.model.dtype)
        # connect every peer of the plan: neighbours, the other end (tied weights), group members, state donors
        everyone = {sl.peer: sl for pp in plan.pipelines for sl in pp}
        groups = plan.groups_of(peer_id)
        for pid, sl in everyone.items():
            if pid != peer_id:
                key = sl.curve_public_key.encode() if sl.curve_public_key else None
                transport.connect(pid, sl.endpoint, region=sl.region, curve_server_key=key)

        self.store = store
        self.spares = spares  # the plan's spares ``transport`` is connected to: state donors of last resort
        self.state_source = "seed"  # where the initial global state came from (own, checkpoint, store, peers)
        t_state = time.perf_counter()
        state = self._initial_state(previous_state, previous_plan, links or {})
        self._caught_up: dict[tuple[int, int], int] = {}  # a group's newer round taken from its members
        state = self._catch_up(state)
        self.state_s = time.perf_counter() - t_state  # loading or fetching the initial global state
        if state is not None:
            self._load_global(state)
        self.round = state.round if state is not None else 0

        ds = dataset_for(job) if s == 0 or s + 1 == len(pipe) else None  # only the ends read data
        pcfg = job.pipeline
        num_pipes = len(plan.pipelines)
        seq_len = job.model.context
        batch = pcfg.micro_batch_size * pcfg.microbatches

        def data(step: int) -> torch.Tensor:
            assert ds is not None
            b = ds.get_batch(step, batch_size=batch, seq_len=seq_len, seed=seed, shard=p, num_shards=num_pipes)
            return b.to(self.device, non_blocking=True)  # (B, T + 1)

        act_codec = plan.hop_codec(p, s)[0] if s + 1 < len(pipe) else "none"
        grad_codec = plan.hop_codec(p, s - 1)[1] if s > 0 else "none"
        opt = job.optimizer
        self.runtime = StageRuntime(
            StageConfig(
                job=plan.job_id,
                plan_version=plan.version,
                pipeline=p,
                stage=s,
                num_stages=len(pipe),
                # one stage: the microbatches only accumulate gradients, and may run as one pass
                microbatches=1 if pcfg.merge_microbatches and len(pipe) == 1 else pcfg.microbatches,
                schedule=pcfg.schedule,
                act_codec=act_codec,
                grad_codec=grad_codec,
                hop_timeout_s=job.swarm.hop_timeout_s,
                lr=opt.lr,
                weight_decay=opt.weight_decay,
                betas=(opt.beta1, opt.beta2),
                lr_schedule=LRSchedule(lr=opt.lr, warmup_steps=opt.warmup_steps, kind=opt.schedule,
                                       decay_steps=job.decay_steps, min_lr_ratio=opt.min_lr_ratio),
                compute_dtype=job.model.dtype,
            ),
            stage=self.stage,
            transport=transport,
            prev_peer=pipe[s - 1].peer if s > 0 else None,
            next_peer=pipe[s + 1].peer if s + 1 < len(pipe) else None,
            end_peer=(pipe[-1].peer if s == 0 else pipe[0].peer) if len(pipe) > 1 else None,
            data=data,
            local=local,
        )
        named = dict(self.stage.named_parameters())
        # state() is served from the transport's handler threads: never read half a commit. The syncs hold it
        # only while applying a round, so a donor answers a joiner at once even while its round is in flight
        self._commit_lock = threading.Lock()
        self.syncs: list[DiLoCoSync] = []
        # every group of this stage answers sync.ask through one router per transport (the agent's, or ours)
        self._own_router = router is None
        self._router = router if router is not None else GroupRouter(transport)
        try:
            for g in groups:
                params = [(n, named[n]) for n in named if g.start <= block_of(n) < g.end]
                members = [
                    Member(peer_id=m, region=everyone[m].region or "default", address=everyone[m].endpoint)
                    for m in g.members
                ]
                sync = DiLoCoSync(
                    self._sync_config(g), params=params, transport=transport, membership=StaticMembership(members),
                    commit_lock=self._commit_lock, router=self._router,
                )
                self.syncs.append(sync)
                sync.set_context(job=plan.job_id, plan_version=plan.version)
                if state is not None and all(n in state.params for n, _ in params):
                    load_named_state(sync, replace(
                        state, round=self._caught_up.get((g.start, g.end), state.round)))
                elif state is not None:
                    logger.warning("group %s: no complete global state; its blocks restart from the seed", g.name)
        except Exception:
            self._close_syncs()  # a half-built worker must not keep its groups registered on the transport
            self.runtime.close()
            raise
        self.round = min((o.version for sync in self.syncs for o in sync.outer), default=self.round)
        self.local_restored = state is not None and self._restore_local(state)
        self.tokens = 0
        self.last_loss: float | None = None
        self.compute_s = 0.0
        self.wall_s = 0.0
        self.checkpoint_s = 0.0
        self.checkpoint_failures = 0  # checkpoint writes the disk refused (each retried at the next boundary)
        self.peer_checkpoints = 0  # checkpoints handed to the state store
        self.steps = 0
        self._applied: _AppliedStep | None = None
        self._cpu0 = time.process_time()
        self._step = plan.start_step
        self._stored_at = -1  # the step of the last state handed to the store
        # what a resumed or joining peer adopted, as the syncs hold it (SHA-256 over names and bytes)
        self.initial_digest = digest(self.state().params)[0] if self.state_source not in ("seed", "own") else None

    # -- construction helpers ---------------------------------------------------------------------
    def _sync_config(self, g: SyncGroup) -> DiLoCoConfig:
        """The group's DiLoCoConfig: the job's sync section as is, except ``fragments``, which cannot exceed
        the group's parameter tensors (a fragment is at least one tensor): fewer, said in a warning."""
        sc = self.job.sync
        tensors = sum(1 for n, _ in self.stage.named_parameters() if g.start <= block_of(n) < g.end)
        fragments = sc.fragments
        if fragments > max(1, tensors):
            fragments = max(1, tensors)
            logger.warning(
                "stage group %s: sync.fragments = %d, but its blocks [%d, %d) hold %d parameter tensors and a "
                "fragment is at least one: it syncs in %d fragments", g.name, sc.fragments, g.start, g.end,
                tensors, fragments,
            )
        return DiLoCoConfig(
            every=sc.every,
            outer_lr=sc.outer_lr,
            outer_momentum=sc.outer_momentum,
            nesterov=sc.nesterov,
            intra_codec=sc.intra_codec,
            cross_codec=self.plan.sync_codec,
            error_feedback=sc.error_feedback,
            fragments=fragments,
            overlap=sc.overlap,
            mixing=sc.mixing,
            aggregation=sc.aggregation,
            deadline_floor_s=self.job.swarm.round_timeout_s,
            group=f"{self.plan.job_id}/{g.name}",
        )

    def _initial_state(
        self, previous: StageState | None, previous_plan: JobPlan | None, links: dict[str, LinkMeasurement]
    ) -> StageState | None:
        """Global state for this stage's blocks: own, else gathered from the plan's peers (and the previous
        plan's), else None (seed)."""
        names = [n for n, _ in self.stage.named_parameters()]
        start, end = self.stage.layers
        sat_out = previous_plan is not None and previous_plan.slot_of(self.peer_id) is None
        floor = self.plan.state_floor
        if previous is not None and (sat_out or previous.step < floor):
            # stale: kept from an older plan, and this peer sat out the one since (a spare while the others
            # trained on): its rounds are older than its group's, and adopting them would split the group
            logger.info("own state of step %d predates plan v%d (state from step %d on): not adopted, fetched "
                        "instead", previous.step, self.plan.version, floor)
            previous = None
        own = previous.select(start, end) if previous is not None else None
        if own is not None and own.covers(names):
            self.state_source = "own"
            return own
        if previous_plan is None and self.plan.resume_step is not None and self.plan.checkpoint_dir:
            from geotrain.peers import checkpoint

            ck = checkpoint.load(Path(self.plan.checkpoint_dir), self.plan.resume_step,
                                 job_id=self.plan.job_id, start=start, end=end)
            if not ck.covers(names):
                raise StateTransferError(f"checkpoint step {self.plan.resume_step} lacks blocks {self.stage.layers}")
            self.state_source = "checkpoint"
            return ck
        if self.plan.start_step == 0 and previous_plan is None and self.plan.version == 1:
            return None  # a fresh job: the seed gives every member identical weights
        # a peer holding nothing of the job yet (new, or a spare until now) past step 0: on a resume, only the
        # checkpoint of the resume step will do
        want_step = self.plan.resume_step if previous is None else None
        if previous is None and self.store is not None:
            mine = self.store.load(self.plan.job_id, want_step if want_step is not None else floor, start, end)
            if mine is not None:
                own = mine if own is None else own.merge(mine)
                if own.covers(names):
                    self.state_source = "store"
                    return own
        # the plan's peers first (alive a moment ago), of those who held these blocks in the previous plan first,
        # then the fastest measured links; last the previous plan's peers this plan left out (spares now, or
        # dead): a block only they hold would otherwise restart from the seed
        plan_peers = set(self.plan.peers)
        held_before: set[str] = set()
        if previous_plan is not None:
            for pp in previous_plan.pipelines:
                for sl in pp:
                    if not (sl.start < end and start < sl.end):
                        continue
                    held_before.add(sl.peer)
                    if sl.peer not in plan_peers and sl.peer != self.peer_id and sl.endpoint:
                        key = sl.curve_public_key.encode() if sl.curve_public_key else None
                        self.transport.connect(sl.peer, sl.endpoint, region=sl.region, curve_server_key=key)
        left_out = held_before - plan_peers
        # of those, the ones the new plan does not list as spares either were gone when it was made (dead,
        # most likely): asked only if they answer a ping, so a dead one costs seconds, not a state timeout
        gone = left_out - set(self.plan.spares)
        if gone:
            alive = answering(self.transport, gone, timeout=min(GONE_PING_S, self.job.swarm.round_timeout_s))
            if gone - alive:
                logger.info("blocks [%d, %d): not asking %s for state (left out of plan v%d, no answer to a ping)",
                            start, end, sorted(gone - alive), self.plan.version)
            left_out -= gone - alive
        # a peer new to the job knows no previous plan: the holders the new plan left out are among its spares
        # (the agent connected those it could reach, ``spares``); asked last
        spares = set(self.spares) - plan_peers - held_before if previous_plan is None else set()
        # the peers this plan gives these blocks hold them too, most likely (a replan keeps most slots)
        holding_now = {sl.peer for pp in self.plan.pipelines for sl in pp if sl.start < end and start < sl.end}
        likely = (held_before | holding_now) - {self.peer_id}
        donors = sorted(
            (p for p in plan_peers | left_out | spares if p != self.peer_id),
            key=lambda m: (m in spares, m not in plan_peers, m not in held_before, m not in likely,
                           -(links[m].bandwidth_bps if m in links else 0.0)),
        )
        try:
            got = fetch_state(
                self.transport, donors, job_id=self.plan.job_id, start=start, end=end, need=names, have=own,
                timeout=self.job.swarm.round_timeout_s, step=want_step,
                min_step=floor if want_step is None else None,
                sizes={n: p.numel() for n, p in self.stage.named_parameters()},
                parallel=_parallel_donors(donors, likely, links), plan_version=self.plan.version,
            )
            self.state_source = "peers"
            return got
        except StateTransferError as e:
            if floor == 0 and own is None:
                # a replan before any round (a joiner's first plan): nobody trained these blocks yet
                logger.info("blocks [%d, %d): no peer holds state at step 0 (%s); the seed", start, end, e)
                return None
            remote = self.store.load_remote(self.plan.job_id, want_step if want_step is not None else floor,
                                            start, end) if self.store is not None else None
            if remote is not None:
                got = remote if own is None else own.merge(remote)
                if got.covers(names):
                    logger.warning("blocks [%d, %d): no live peer holds them (%s); taken from checkpoint.remote",
                                   start, end, e)
                    self.state_source = "remote"
                    return got
            held = own.params if own is not None else {}
            lost = sorted({block_of(n) for n in names if n not in held})
            rnd = (want_step if want_step is not None else floor) // max(1, self.job.sync.every)
            if not self.job.checkpoint.allow_seed_restart:
                raise StateLostError(
                    f"blocks {lost} of job {self.plan.job_id} have no reachable holder at round {rnd} "
                    f"(step {want_step if want_step is not None else floor}): no live peer, no state directory, no remote holds them ({e}); "
                    "restart the peers that hold them, or set checkpoint.allow_seed_restart = true to "
                    "restart them from the seed", blocks=lost, round=rnd,
                ) from e
            # never train on partial weights: what no live peer holds restarts from the seed, named in the log
            logger.warning("incomplete stage state (%s); blocks %s restart from the seed at round %d "
                           "(checkpoint.allow_seed_restart)", e, lost, rnd)
            return own

    def _catch_up(self, state: StageState | None) -> StageState | None:
        """The newest committed state of each of this stage's groups, so a group starts its plan from one state.

        A replan's start step comes from progress records that lag the peers by up to half a liveness
        period: a member that committed one more round than the records said carries it into the new plan,
        while another member of its group starts from the round before. Their rounds would then average
        pseudo-gradients taken from two different global models, and the two copies would never agree again.
        So before training, each member asks its group's other members (``state.head``: round and step, no
        tensors) and, when one holds a newer round than its own, takes that state (verified as any fetch).
        Every member does the same, so the group starts from its newest round. Not needed where every member
        starts from one given state: a new job, or a resume's first plan from a checkpoint.
        """
        if state is None or self.state_source == "checkpoint":
            return state
        floor = self.plan.state_floor
        timeout = min(GONE_PING_S, self.job.swarm.round_timeout_s)
        for g in self.plan.groups_of(self.peer_id):
            others = [m for m in g.members if m != self.peer_id]
            mine = [n for n in state.params if g.start <= block_of(n) < g.end]
            if not others or not mine:
                continue
            heads = state_heads(self.transport, others, job_id=self.plan.job_id, start=g.start, end=g.end,
                                timeout=timeout, plan_version=self.plan.version)
            newer = {m: h for m, h in heads.items() if h[0] > state.round and h[1] >= floor}
            if not newer:
                continue
            best = max(h[0] for h in newer.values())
            donors = sorted(newer, key=lambda m: -newer[m][0])
            names = [n for n, _ in self.stage.named_parameters() if g.start <= block_of(n) < g.end]
            try:
                got = fetch_state(self.transport, donors, job_id=self.plan.job_id, start=g.start, end=g.end,
                                  need=names, timeout=self.job.swarm.round_timeout_s, min_step=floor,
                                  min_round=best, plan_version=self.plan.version)
            except StateTransferError as e:
                logger.warning("group %s: members hold round %d, this peer round %d, and the newer state could "
                               "not be fetched (%s): starting from its own", g.name, best, state.round, e)
                continue
            logger.info("group %s: this peer's state is of round %d, %s hold round %d: taken from them so the "
                        "group starts from one state", g.name, state.round, ", ".join(donors), got.round)
            others_p = {n: t for n, t in state.params.items() if not g.start <= block_of(n) < g.end}
            others_m = {n: t for n, t in state.momentum.items() if not g.start <= block_of(n) < g.end}
            state = StageState(state.job_id, state.round, max(state.step, got.step),
                               {**others_p, **got.params}, {**others_m, **got.momentum})
            self._caught_up[(g.start, g.end)] = got.round
            self.state_source = "peers"
        return state

    def head(self, job_id: str, start: int, end: int) -> tuple[int, int] | None:
        """(Any thread.) ``(round, step)`` of the committed state of blocks ``[start, end)``, or None when this
        worker holds none of them (or trains another job)."""
        if job_id != self.plan.job_id:
            return None
        a, z = self.stage.layers
        if not (a < end and start < z):
            return None
        with self._commit_lock:
            versions = [o.version for g, sync in zip(self.plan.groups_of(self.peer_id), self.syncs, strict=False)
                        if g.start < end and start < g.end for o in sync.outer]
            return (min(versions) if versions else self.round), self._step

    def _restore_local(self, state: StageState) -> bool:
        """Adopt ``state``'s local part (residuals, inner optimizer moments) when it comes from this peer's own
        state directory, was taken at this place of the plan and covers this stage whole; True if adopted.
        Anything else starts fresh."""
        slot = (self.pipeline, len(self.plan.pipelines), self.stage_index)
        if self.state_source != "store" or not state.local or state.slot != slot:
            if state.local:
                logger.info("local state of %s not adopted here (%s): residuals and inner optimizer start fresh",
                            state.slot, slot)
            return False
        named = dict(self.stage.named_parameters())
        moments: dict[str, dict[str, torch.Tensor]] = {}
        residuals: dict[tuple[int, int], dict[tuple[str, int], torch.Tensor]] = {}
        for key, t in state.local.items():
            kind, _, rest = key.partition(":")
            if kind == "a":
                name, _, what = rest.rpartition(":")
                moments.setdefault(name, {})[what] = t
            else:  # e:<start>-<end>:<role>:<fragment>
                blocks, role, frag = rest.split(":")
                a, b = blocks.split("-")
                residuals.setdefault((int(a), int(b)), {})[(role, int(frag))] = t
        # a parameter that never had a gradient has no optimizer state, here as in the run that wrote it
        if not set(moments) <= set(named) or any(m.get("exp_avg", torch.empty(0)).shape != named[n].shape
                                                 for n, m in moments.items()):
            logger.info("local state does not fit this stage's parameters; inner optimizer starts fresh")
            return False
        by_range = {(g.start, g.end): sync for g, sync in zip(self.plan.groups_of(self.peer_id), self.syncs,
                                                              strict=True)}
        # with error feedback every group of this plan needs its residuals, taken from the same group (a
        # shard of a wider group selected down to these blocks has none for this one)
        if (self.job.sync.error_feedback or residuals) and set(residuals) != set(by_range):
            logger.info("residuals of groups %s, not of this plan's %s: local state starts fresh",
                        sorted(residuals), sorted(by_range))
            return False
        try:
            for rng, res in residuals.items():
                if rng in by_range:
                    by_range[rng].runner.import_residuals(res)
        except ConfigError as e:
            logger.info("residuals not adopted (%s); they start at zero", e)
            for sync in self.syncs:
                sync.runner.import_residuals({})
            return False
        opt = self.runtime.optimizer
        # a fused AdamW keeps its step counts beside the parameters, the default one on the CPU
        step_device = None if is_fused(opt) else "cpu"
        for n, m in moments.items():
            p = named[n]
            opt.state[p] = {k: v.to(p.device) if k != "step" else v.to(step_device or p.device, copy=True)
                            for k, v in m.items()}
        return True

    def local_state(self) -> dict[str, torch.Tensor]:
        """This peer's local state as checkpoint tensors (copies): residuals and inner optimizer moments.

        Called on the step thread between steps (the optimizer is idle then); see :class:`StageState`."""
        out: dict[str, torch.Tensor] = {}
        for g, sync in zip(self.plan.groups_of(self.peer_id), self.syncs, strict=True):
            for (role, frag), t in sync.runner.export_residuals().items():
                out[f"e:{g.start}-{g.end}:{role}:{frag}"] = t
        params = {id(p): n for n, p in self.stage.named_parameters()}
        for p, st in self.runtime.optimizer.state.items():
            name = params.get(id(p))
            if name is None:
                continue
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    out[f"a:{name}:{k}"] = v.detach().to("cpu", copy=True)
        return out

    def _load_global(self, state: StageState) -> None:
        with torch.no_grad():
            for n, p in self.stage.named_parameters():
                if n in state.params:
                    p.copy_(state.params[n].to(p.dtype).view_as(p))

    # -- the step ---------------------------------------------------------------------------------
    def step(self, step: int) -> Any:
        """Inner step ``step``, with one commit point.

        Three phases: (1) the inner step proper (microbatches, forward, backward, optimizer step: the
        weights move); (2) the rounds due after it (each sync once); (3) the checkpoint due after it. The
        step *commits* (``_step`` and the counters advance) only when (2) is done and (3) was written or
        explicitly skipped: a checkpoint the disk refuses is logged and counted
        (``checkpoint_failures``), training state is kept, and the next checkpoint boundary writes again.
        A failure in (1) (:class:`~geotrain.errors.StageFailedError`) applies nothing. A failure in (2)
        raises with the step applied but not committed: calling ``step`` again with the same step resumes
        after (1), so the optimizer step is never applied twice and the syncs that finished are not run
        again.
        """
        t0 = time.perf_counter()
        applied = self._applied
        if applied is None:
            applied = _AppliedStep(step, self.runtime.run_inner_step(step))  # the weights move here
            self._applied = applied
        else:
            assert applied.step == step, f"step {step} asked while step {applied.step} is applied, not committed"
            logger.info("resuming step %d after its optimizer step (not applied again)", step)
        m = applied.metrics
        for i, sync in enumerate(self.syncs):
            if i not in applied.synced:
                sync.after_inner_step(step + 1)  # the sync counts inner steps completed
                applied.synced.add(i)
        self.round = min((o.version for sync in self.syncs for o in sync.outer), default=self.round)
        t1 = time.perf_counter()
        self._checkpoint_or_count(step + 1)
        self._peer_checkpoint(step + 1)
        self.checkpoint_s += time.perf_counter() - t1
        # the commit point: from here on this step counts
        self._applied = None
        self._step = step + 1
        self.wall_s += time.perf_counter() - t0
        self.compute_s += m.compute_s
        self.steps += 1
        if self.stage.is_last:
            self.tokens += m.tokens
            self.last_loss = m.loss
        elif self.stage.is_first:
            self.tokens += m.tokens
        return m

    def finish(self) -> None:
        """The stop step is reached: apply the rounds still in flight, then checkpoint the final state.

        With streaming (overlap > 0) the round started at the last boundary is due
        ``overlap`` steps later, which never come: without this the final global
        model (checkpoint, report, state served to the coordinator) would miss the
        last round. Every member stops at the same step, so all of them take part.
        """
        for sync in self.syncs:
            sync.flush()
        self.round = min((o.version for sync in self.syncs for o in sync.outer), default=self.round)
        self._checkpoint_or_count(self._step)  # rewrites the boundary's checkpoint with the flushed state
        self._peer_checkpoint(self._step, final=True)
        if self.store is not None and not self.store.flush(self.job.swarm.round_timeout_s * 2):
            logger.error("the final peer checkpoint is still being written")

    def _peer_checkpoint(self, done: int, *, final: bool = False) -> None:
        """After inner step ``done``, if a checkpoint round ends there (or ``final``): this peer's blocks to its
        state store (a copy now, the write on the store's thread)."""
        every = self.job.sync.every * self.job.checkpoint.every_rounds
        if self.store is None or every <= 0 or done % every or done == 0:
            return
        if final and self.peer_checkpoints and self._stored_at == done and not self.job.sync.overlap:
            return  # the boundary's checkpoint already holds this state (no round was in flight)
        state = self.state(step=done)
        state.local = self.local_state()
        state.slot = (self.pipeline, len(self.plan.pipelines), self.stage_index)
        groups = self.plan.groups_of(self.peer_id)
        ranges = [(g.start, g.end) for g in groups]
        leads = [(g.start, g.end) for g in groups if g.members and g.members[0] == self.peer_id]
        self.store.submit(state, ranges, upload=leads if self.store.remote is not None else ())
        self.peer_checkpoints += 1
        self._stored_at = done

    def _checkpoint_or_count(self, done: int) -> None:
        """The checkpoint after inner step ``done``, if one is due; a refused write is logged and counted."""
        try:
            self._maybe_checkpoint(done)
        except CheckpointError as e:
            self.checkpoint_failures += 1
            logger.error("checkpoint after step %d not written (%d so far; the next boundary retries): %s",
                         done, self.checkpoint_failures, e)

    def _maybe_checkpoint(self, done: int) -> None:
        """After a round boundary: the first member of each of this peer's groups writes the group's state."""
        plan = self.plan
        if not plan.checkpoint_dir or plan.checkpoint_every <= 0 or done % plan.checkpoint_every:
            return
        from geotrain.peers import checkpoint

        state = self.state(step=done)
        for g in self.plan.groups_of(self.peer_id):
            if g.members[0] == self.peer_id:
                checkpoint.save_group(Path(plan.checkpoint_dir), state, start=g.start, end=g.end)

    def stats(self) -> dict[str, float]:
        """Where this peer's time went since it took its stage (seconds; the report's ``peer_stats``).

        ``wall_s`` is inside :meth:`step`: ``compute_s`` of it in forward/backward, ``sync_wait_s`` waiting for
        rounds' results, ``checkpoint_s`` writing checkpoints, the rest hops and the optimizer step.
        ``round_s`` sums the rounds' own durations (they overlap compute when ``sync.overlap > 0``);
        ``cpu_s`` is the whole process's CPU time (every thread), the figure to compare with its host's cores.
        """
        sync = [s.stats for s in self.syncs]
        return {
            "compute_s": self.compute_s,
            "wall_s": self.wall_s,
            "utilisation": self.compute_s / self.wall_s if self.wall_s else 0.0,
            "steps": float(self.steps),
            "sync_wait_s": sum(s.wait_s for s in sync),
            "round_s": sum(s.round_s for s in sync),
            "rounds": float(sum(s.rounds_committed + s.rounds_discarded for s in sync)),
            "checkpoint_s": self.checkpoint_s,
            "checkpoint_failures": float(self.checkpoint_failures + (self.store.failures if self.store else 0)),
            "checkpoints": float(self.peer_checkpoints),
            "state_s": self.state_s,
            "checkpoint_write_s": self.store.write_s if self.store else 0.0,
            "checkpoint_bytes": float(self.store.bytes_written) if self.store else 0.0,
            "shards_refused": float(self.store.refused) if self.store else 0.0,
            "checkpoint_submit_wait_s": self.store.submit_wait_s if self.store else 0.0,
            "checkpoint_uploads_failed": float(self.store.upload_failures) if self.store else 0.0,
            "cpu_s": time.process_time() - self._cpu0,
            "pipeline": float(self.pipeline),
            "stage": float(self.stage_index),
        }

    def state(self, *, step: int | None = None) -> StageState:
        """The committed global state of this stage (``step``: the inner step it is stamped with; default the
        last committed one)."""
        params: dict[str, torch.Tensor] = {}
        momentum: dict[str, torch.Tensor] = {}
        with self._commit_lock:
            for sync in self.syncs:
                g, mom = named_state(sync)
                params.update(g)
                momentum.update(mom)
            rnd = min((o.version for sync in self.syncs for o in sync.outer), default=self.round)
        return StageState(self.plan.job_id, rnd, self._step if step is None else step, params, momentum)

    def interrupt(self, reason: str) -> None:
        """(Any thread.) A newer plan exists: a step stuck waiting on a neighbour gives up now
        (:class:`~geotrain.errors.PlanSupersededError`, nothing applied) instead of after the hop timeout."""
        self.runtime.interrupt(reason)

    def close(self) -> None:
        self._close_syncs()
        self.runtime.close()

    def _close_syncs(self) -> None:
        try:
            for sync in self.syncs:
                sync.close()
        finally:
            for sync in self.syncs:
                sync.runner.close()  # idempotent: unregistered even when a flush failed
            if self._own_router:
                self._router.close()


#: seconds a previous holder the new plan left out (not even a spare) has to answer a ping before it is asked
GONE_PING_S = 2.0


#: donors a stage's state is fetched from at once, at most (chunks of about equal bytes, verified whole)
MAX_PARALLEL_DONORS = 4


def _parallel_donors(donors: list[str], likely: set[str], links: dict[str, LinkMeasurement]) -> int:
    """How many of the leading donors to fetch chunks from at once: those likely to hold the blocks, on links
    at least half as fast as the best donor's (a chunk on a slow link would hold the whole fetch up)."""
    lead = [d for d in donors[:MAX_PARALLEL_DONORS] if d in likely]
    if len(lead) < 2:
        return 1
    rates = [links[d].bandwidth_bps if d in links else None for d in lead]
    best = max((r for r in rates if r is not None), default=None)
    return max(1, sum(1 for r in rates if best is None or r is None or r >= best / 2))


def _split(flat: torch.Tensor, names: tuple[str, ...], params: tuple[torch.nn.Parameter, ...]) -> dict[str, torch.Tensor]:
    out, pos = {}, 0
    for n, p in zip(names, params, strict=True):
        out[n] = flat[pos : pos + p.numel()].view_as(p).clone()
        pos += p.numel()
    return out


def named_state(sync: DiLoCoSync) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A sync's global parameters and outer momentum, by parameter name (fragment layout aside)."""
    params: dict[str, torch.Tensor] = {}
    momentum: dict[str, torch.Tensor] = {}
    for frag, outer in zip(sync.fragments, sync.outer, strict=True):
        params.update(_split(outer.global_flat, frag.names, frag.params))
        if outer.momentum is not None:
            momentum.update(_split(outer.momentum, frag.names, frag.params))
    return params, momentum


def load_named_state(sync: DiLoCoSync, state: StageState) -> None:
    """Adopt global parameters (and momentum, when complete) by name; local := global."""
    frags = []
    for frag in sync.fragments:
        entry: dict[str, Any] = {
            "names": list(frag.names),
            "global": torch.cat([state.params[n].reshape(-1).float() for n in frag.names]),
            "version": state.round,
        }
        if all(n in state.momentum for n in frag.names):
            entry["momentum"] = torch.cat([state.momentum[n].reshape(-1).float() for n in frag.names])
        frags.append(entry)
    sync.load_state_dict({"fragments": frags})
