"""Stage state transfer: a joiner (or the coordinator) pulls global parameters from group members.

What is stage state? For the blocks a peer holds: the *global* parameters of
the last committed round (what every member of the stage group agrees on),
the outer optimizer's momentum for them, and the round counter. Local
(inner) weights are never shipped: a peer that adopts a plan starts its inner
steps from the global parameters.

Protocol (request/response on the data plane, kind ``state.get``): the request
names the job and a block range; the reply carries every tensor the donor holds
in that range (``p:<name>`` global parameter, ``o:<name>`` outer momentum), and
in its meta the round, the names, the total byte count and a SHA-256 over
names and bytes. The receiver verifies count and hash before any tensor is
used: a truncated or altered transfer is refused (StateTransferError) and the
next donor is tried, fastest link first.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from geotrain.errors import StateTransferError, TransportError
from geotrain.transport import Message, Transport

logger = logging.getLogger(__name__)

KIND = "state.get"


def block_of(name: str) -> int:
    """Block index of a stage parameter name ``blocks.<i>.<...>``."""
    parts = name.split(".")
    if len(parts) < 3 or parts[0] != "blocks" or not parts[1].isdigit():
        raise StateTransferError(f"parameter name {name!r} is not of the form blocks.<index>.<name>")
    return int(parts[1])


def local_block(key: str) -> int:
    """Block index of a local-state key: ``a:<param name>:<what>`` (inner optimizer state of a parameter) or
    ``e:<start>-<end>:<role>:<fragment>`` (an error-feedback residual of the stage group of blocks
    ``[start, end)``, filed under its first block)."""
    kind, _, rest = key.partition(":")
    if kind == "a":
        return block_of(rest.rpartition(":")[0])
    if kind == "e":
        first = rest.partition("-")[0]
        if first.isdigit():
            return int(first)
    raise StateTransferError(f"local state key {key!r} is neither a:<param>:<what> nor e:<start>-<end>:<role>:<n>")


@dataclass
class StageState:
    """Global parameters and outer momentum of some blocks, as of committed round ``round``.

    What is *local* state? What one peer needs, beyond the group's global state, to continue its own
    trajectory bit-identically: its error-feedback residuals (per stage group, role and fragment) and its
    inner optimizer's moments (AdamW ``exp_avg``, ``exp_avg_sq``, ``step`` per parameter), keyed as
    :func:`local_block` describes. It is this peer's alone, valid only at the ``slot`` = (pipeline, number
    of pipelines, stage) it was taken at (a pipeline's data shard and its stage's gradients depend on
    those), so it stays in this peer's own state directory: it is never sent to other peers nor taken
    from the remote. The data position
    needs no field: a pipeline's batch of inner step ``s`` is a pure function of (seed, pipeline,
    pipelines, s), so ``step`` is the position.
    """

    job_id: str
    round: int
    step: int
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor] = field(default_factory=dict)
    local: dict[str, torch.Tensor] = field(default_factory=dict)
    slot: tuple[int, int, int] | None = None

    def select(self, start: int, end: int) -> StageState:
        keep = lambda d: {n: t for n, t in d.items() if start <= block_of(n) < end}  # noqa: E731
        local = {k: t for k, t in self.local.items() if start <= local_block(k) < end}
        return StageState(self.job_id, self.round, self.step, keep(self.params), keep(self.momentum), local,
                          self.slot)

    def merge(self, other: StageState) -> StageState:
        """Union of two disjoint pieces (the lower round wins, conservatively); local state only when both
        pieces' local state is of one slot (else it is dropped: never mix two trajectories)."""
        if not other.local:
            local, slot = dict(self.local), self.slot
        elif not self.local:
            local, slot = dict(other.local), other.slot
        elif self.slot == other.slot:
            local, slot = {**self.local, **other.local}, self.slot
        else:
            local, slot = {}, None
        return StageState(
            self.job_id,
            min(self.round, other.round),
            min(self.step, other.step),
            {**self.params, **other.params},
            {**self.momentum, **other.momentum},
            local,
            slot,
        )

    def covers(self, names: Iterable[str]) -> bool:
        return all(n in self.params for n in names)

    def without_local(self) -> StageState:
        """The group's part only (what another peer may adopt)."""
        return StageState(self.job_id, self.round, self.step, self.params, self.momentum)


def digest(tensors: Mapping[str, torch.Tensor]) -> tuple[str, int]:
    """SHA-256 and byte count over (name, bytes) in name order."""
    h = hashlib.sha256()
    total = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(raw)
        total += len(raw)
    return h.hexdigest(), total


def serve_state(
    transport: Transport,
    current: Callable[[], Any],
    previous: Callable[[], StageState | None],
    stored: Callable[[str, int, int, int], StageState | None] | None = None,
) -> None:
    """Answer ``state.get`` from the current worker's state, topped up with blocks this peer held before.

    After a replan a peer may hold other blocks than it did; a joiner that
    needs the old ones still gets them from here. A request that names a
    ``step`` (a resume from checkpoint ``step``) is answered only with state of
    that step: from memory when it is that step's, else from ``stored(job_id,
    start, end, step)`` (the peer's own checkpoints, :mod:`geotrain.peers.statestore`).
    """

    def handle(req: Message) -> Message | None:
        meta = req.meta
        job_id, start, end = meta.get("job_id"), meta.get("start"), meta.get("end")
        step = meta.get("step")
        if not isinstance(job_id, str) or not isinstance(start, int) or not isinstance(end, int) or start >= end:
            return Message(kind=KIND + ".err", meta={"error": "bad request"})
        if step is not None and not isinstance(step, int):
            return Message(kind=KIND + ".err", meta={"error": "bad request"})
        worker = current()
        pieces = [worker.state() if worker is not None else None, previous()]
        if step is not None and stored is not None:
            pieces.append(stored(job_id, start, end, step))
        piece: StageState | None = None
        for st in pieces:
            if st is None or st.job_id != job_id or (step is not None and st.step != step):
                continue
            sel = st.select(start, end)
            if piece is None:
                piece = sel
            else:  # blocks the current state lacks, from the previous one
                extra = StageState(sel.job_id, sel.round, sel.step,
                                   {n: t for n, t in sel.params.items() if n not in piece.params},
                                   {n: t for n, t in sel.momentum.items() if n not in piece.momentum})
                if extra.params:
                    piece = piece.merge(extra)
        if piece is None or not piece.params:
            return Message(kind=KIND + ".err", meta={"error": "no state for those blocks of that job"})
        tensors = {f"p:{n}": t for n, t in piece.params.items()}
        tensors.update({f"o:{n}": t for n, t in piece.momentum.items()})
        sha, nbytes = digest(tensors)
        return Message(
            kind=KIND + ".ok",
            meta={"round": piece.round, "step": piece.step, "sha256": sha, "nbytes": nbytes, "names": sorted(tensors)},
            tensors=tensors,
        )

    transport.serve(KIND, handle)


def fetch_state(
    transport: Transport,
    donors: Iterable[str],
    *,
    job_id: str,
    start: int,
    end: int,
    need: Iterable[str] = (),
    have: StageState | None = None,
    timeout: float = 60.0,
    step: int | None = None,
    min_step: int | None = None,
) -> StageState:
    """Gather blocks ``[start, end)`` from donors, best first, until every name in ``need`` is held.

    Each reply is verified (names, byte count, SHA-256) before any of it is
    used; a donor that fails verification or does not answer is skipped.
    ``have`` is state already held (it wins over donors' copies). ``donors``
    must be connected on ``transport``. Without ``need``, the first verified
    reply is enough. With ``step``, only state of checkpoint ``step`` is asked for and accepted. With
    ``min_step`` (a replan's start step), a reply stamped with an older step is refused: it is *stale*, the
    state of a donor that sat out rounds since (a spare kept it from an older plan), and the stage group
    it would join has moved on.
    """
    need = list(need)
    state = have
    errors = []
    for donor in donors:
        if state is not None and (state.covers(need) if need else state.params):
            break
        ask: dict[str, Any] = {"job_id": job_id, "start": start, "end": end}
        if step is not None:
            ask["step"] = step
        try:
            reply = transport.request(donor, Message(kind=KIND, meta=ask), timeout=timeout)
        except TransportError as e:
            errors.append(f"{donor}: {e}")
            continue
        meta = reply.meta
        if reply.kind != KIND + ".ok":
            errors.append(f"{donor}: {meta.get('error', reply.kind)}")
            continue
        sha, nbytes = digest(reply.tensors)
        if sorted(reply.tensors) != meta.get("names") or nbytes != meta.get("nbytes") or sha != meta.get("sha256"):
            errors.append(f"{donor}: state failed verification (size or hash mismatch)")
            logger.warning("state from %s failed verification; trying the next donor", donor)
            continue
        if step is not None and meta.get("step") != step:
            errors.append(f"{donor}: state of step {meta.get('step')}, not {step}")
            continue
        if min_step is not None and int(meta.get("step", 0)) < min_step:
            errors.append(f"{donor}: stale state of step {meta.get('step')}, before step {min_step}")
            continue
        params = {k[2:]: v for k, v in reply.tensors.items() if k.startswith("p:")}
        momentum = {k[2:]: v for k, v in reply.tensors.items() if k.startswith("o:")}
        got = StageState(job_id, int(meta.get("round", 0)), int(meta.get("step", 0)), params, momentum)
        if state is None:
            state = got
        else:
            extra = {n: t for n, t in got.params.items() if n not in state.params}
            if extra:
                state = state.merge(StageState(job_id, got.round, got.step, extra,
                                               {n: t for n, t in got.momentum.items() if n in extra}))
    if state is not None and (state.covers(need) if need else state.params):
        return state
    missing = [n for n in need if state is None or n not in state.params][:3]
    raise StateTransferError(
        f"no verified state for blocks [{start}, {end}) (missing e.g. {missing}): " + "; ".join(errors)
    )
