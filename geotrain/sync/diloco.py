"""DiLoCo in a stage group: what a peer agent drives after every inner step.

DiLoCo (Douillard et al., arXiv 2311.08105): each member trains its copy of
the stage for ``every`` (H) inner steps, then the group averages the
*pseudo-gradients* ``global - local`` and an outer optimizer (SGD with Nesterov
momentum, lr 0.7, momentum 0.9) moves the shared *global* copy; local := global.

Streaming DiLoCo (Douillard et al., arXiv 2501.18512): the parameters are cut
into ``fragments`` (F) synced at staggered inner steps (fragment p at steps
``p*H/F + k*H``); each round runs in a background thread while inner steps go
on, and its result is applied ``overlap`` (tau) steps later as
``local := mixing * local + (1 - mixing) * global`` (alpha = ``mixing``), so the
WAN transfer hides behind compute.

Inner progress when a round fails: a discarded round (quorum lost,
coordinator dead, a shard lost) changes nothing, so the next round's
pseudo-gradient carries the whole local progress since the last commit. A
member whose vector was not counted in a committed round (late, dead leader,
bad values) still applies the outer step, shifting its local weights by the
same update so its uncounted progress is kept. See
:mod:`geotrain.sync.round` for who decides what and the single commit point.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from geotrain.errors import ConfigError
from geotrain.sync.config import DiLoCoConfig
from geotrain.sync.membership import Membership, RoundId
from geotrain.sync.outer import Fragment, OuterState, commit, split_fragments
from geotrain.sync.round import GroupRouter, RoundOutcome, RoundRunner, SyncStats
from geotrain.transport import Transport

__all__ = ["DiLoCoSync"]

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    round_id: RoundId
    apply_at: int
    future: concurrent.futures.Future[RoundOutcome]


class DiLoCoSync:
    """One member's side of its stage group's DiLoCo rounds.

    Build it on every member from the same parameter list (same names, same
    order, same initial values) and call :meth:`after_inner_step` with the
    number of inner steps completed so far. Several instances (one per stage group, each with its own
    ``config.group``) may share a transport when they share its ``router``
    (:class:`~geotrain.sync.round.GroupRouter`: ``sync.ask`` is dispatched by group);
    without one, the sync's runner serves ``sync.ping``/``sync.ask`` on the transport
    itself. :meth:`close` unregisters the group.
    """

    def __init__(
        self,
        config: DiLoCoConfig,
        *,
        params: Sequence[tuple[str, nn.Parameter]],
        transport: Transport,
        membership: Membership,
        clock: Callable[[], float] = time.monotonic,
        commit_lock: threading.Lock | None = None,
        router: GroupRouter | None = None,
    ) -> None:
        if config.backend != "geotrain":
            raise ConfigError("DiLoCoSync runs backend 'geotrain'; use HivemindDiLoCoSync for backend 'hivemind'")
        self.config = config
        self.peer_id = transport.peer_id
        self.fragments: list[Fragment] = split_fragments(list(params), config.fragments)
        self.outer = [OuterState(f.flat(), config) for f in self.fragments]
        self.runner = RoundRunner(
            config, transport=transport, membership=membership, numels=[f.numel for f in self.fragments], clock=clock,
            router=router,
        )
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(config.fragments, thread_name_prefix="gt-sync")
            if config.overlap > 0 else None
        )
        self._pending: dict[int, _Pending] = {}
        self.history: list[RoundOutcome] = []
        # held only while a round's result is applied (never while waiting for one): a reader of the global
        # state (a joiner's state transfer, a checkpoint) takes it to see whole commits, and is not kept
        # waiting for a round in flight. Share one lock between the syncs of a peer for one snapshot of all.
        self.commit_lock = commit_lock if commit_lock is not None else threading.Lock()

    @property
    def stats(self) -> SyncStats:
        return self.runner.stats

    def set_context(self, *, job: str, plan_version: int) -> None:
        self.runner.set_context(job=job, plan_version=plan_version)

    # -- the driver's hook ---------------------------------------------------------------------------
    def due(self, step: int, fragment: int) -> RoundId | None:
        """The round fragment ``fragment`` starts after inner step ``step``, if any."""
        since = step - self.config.fragment_offset(fragment)
        if step <= 0 or since < 0 or since % self.config.every:
            return None
        return RoundId(fragment, since // self.config.every)

    def after_inner_step(self, step: int) -> list[RoundOutcome]:
        """Start the rounds due after inner step ``step`` and apply those due; returns the applied outcomes.

        With ``overlap = 0`` a round blocks here until it is done; otherwise it runs in
        the background and this call blocks only if its result is due but not in yet.
        """
        applied = [self._apply_pending(p) for p in sorted(self._pending) if self._pending[p].apply_at <= step]
        for p in range(len(self.fragments)):
            rid = self.due(step, p)
            if rid is None:
                continue
            if p in self._pending:  # the previous round of p is still out: its result comes first
                applied.append(self._apply_pending(p))
            pseudo_grad = self.outer[p].global_flat - self.fragments[p].flat()  # (N_p,)
            if self._pool is None:
                outcome = self.runner.run(rid, pseudo_grad)
                self.runner.add_wait(outcome.seconds)
                self._apply(p, outcome)
                applied.append(outcome)
            else:
                future = self._pool.submit(self.runner.run, rid, pseudo_grad)
                self._pending[p] = _Pending(rid, step + self.config.overlap, future)
        return applied

    def flush(self) -> list[RoundOutcome]:
        """Wait for and apply every round still in flight (end of training, before a checkpoint)."""
        return [self._apply_pending(p) for p in sorted(self._pending)]

    def close(self) -> None:
        """Apply the rounds in flight, stop the round threads, unregister this group from the transport."""
        try:
            self.flush()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self.runner.close()

    def _apply_pending(self, fragment: int) -> RoundOutcome:
        pending = self._pending.pop(fragment)
        t0 = time.monotonic()
        outcome = pending.future.result()  # bounded: a round ends by its own 2x deadline
        self.runner.add_wait(time.monotonic() - t0)
        self._apply(fragment, outcome)
        return outcome

    def _apply(self, p: int, outcome: RoundOutcome) -> None:
        """The commit point on this member: outer step, then the local weights."""
        self.history.append(outcome)
        if not outcome.committed:
            logger.info("round %s %s: %s", outcome.round_id, outcome.status.value, outcome.reason)
            return
        assert outcome.delta is not None
        with self.commit_lock:
            commit(self.fragments[p], self.outer[p], outcome.delta, counted=self.peer_id in outcome.contributors)

    # -- checkpoints and joiners -------------------------------------------------------------------
    def global_flat(self) -> torch.Tensor:
        """The global parameters of every fragment as one vector (for tests and checks)."""
        return torch.cat([o.global_flat for o in self.outer])

    def state_dict(self) -> dict[str, Any]:
        """Global parameters and outer optimizer state of every fragment (torch.save-able, no objects)."""
        return {
            "fragments": [
                {"names": list(f.names), **o.state_dict()} for f, o in zip(self.fragments, self.outer, strict=True)
            ]
        }

    def load_state_dict(self, state: dict[str, Any], *, reset_local: bool = True) -> None:
        """Adopt another member's (or a checkpoint's) global state; local := global unless told otherwise."""
        frags = state.get("fragments")
        if not isinstance(frags, list) or len(frags) != len(self.fragments):
            raise ConfigError(f"state has {len(frags) if isinstance(frags, list) else '?'} fragments; "
                              f"this sync has {len(self.fragments)} (same sync.fragments on every member)")
        for f, o, s in zip(self.fragments, self.outer, frags, strict=True):
            if list(s.get("names", [])) != list(f.names):
                raise ConfigError(f"state fragment {f.index} holds {s.get('names')}; expected {list(f.names)}")
            o.load_state_dict(s)
            if reset_local:
                f.assign(o.global_flat)
