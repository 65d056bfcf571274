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
next donor is tried, fastest link first. A request may list ``names`` (a chunk
of the piece): the reply then carries those tensors only, and in its meta
``whole_sha256``, the hash of the whole piece, so a receiver that fetched
chunks from several donors at once checks they make one donor's state.
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
#: the round and step of the state a peer holds for some blocks, without the tensors
HEAD_KIND = "state.head"


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


#: names one ``state.get`` request may list (a chunk of a stage's parameters)
MAX_NAMES = 4096  # (a request header holds 64 KiB: a chunk of a big stage lists some hundreds)


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
    newer: Callable[[str, int], None] | None = None,
) -> None:
    """Answer ``state.get`` from the current worker's state, topped up with blocks this peer held before.

    ``newer(job_id, plan_version)`` is told the plan a request says its asker follows, before the answer:
    a peer that has not read that plan yet (its news was lost) reads it now. The answer is what this peer
    holds either way; the asker verifies it and refuses a stale one (``min_step``).

    After a replan a peer may hold other blocks than it did; a joiner that
    needs the old ones still gets them from here. A request that names a
    ``step`` (a resume from checkpoint ``step``) is answered only with state of
    that step: from memory when it is that step's, else from ``stored(job_id,
    start, end, step)`` (the peer's own checkpoints, :mod:`geotrain.peers.statestore`).
    """

    def head(req: Message) -> Message | None:
        meta = req.meta
        job_id, start, end = meta.get("job_id"), meta.get("start"), meta.get("end")
        plan_version = meta.get("plan_version")
        if (not isinstance(job_id, str) or type(start) is not int or type(end) is not int or start >= end
                or (plan_version is not None and type(plan_version) is not int)):
            return Message(kind=HEAD_KIND + ".err", meta={"error": "bad request"})
        if newer is not None and plan_version is not None:
            newer(job_id, plan_version)
        worker = current()
        found = worker.head(job_id, start, end) if worker is not None else None
        if found is None:
            prev = previous()
            if prev is not None and prev.job_id == job_id and prev.select(start, end).params:
                found = (prev.round, prev.step)
        if found is None:
            return Message(kind=HEAD_KIND + ".err", meta={"error": "no state for those blocks of that job"})
        return Message(kind=HEAD_KIND + ".ok", meta={"round": found[0], "step": found[1]})

    def handle(req: Message) -> Message | None:
        meta = req.meta
        job_id, start, end = meta.get("job_id"), meta.get("start"), meta.get("end")
        step = meta.get("step")
        if not isinstance(job_id, str) or not isinstance(start, int) or not isinstance(end, int) or start >= end:
            return Message(kind=KIND + ".err", meta={"error": "bad request"})
        if step is not None and not isinstance(step, int):
            return Message(kind=KIND + ".err", meta={"error": "bad request"})
        plan_version = meta.get("plan_version")
        if newer is not None and type(plan_version) is int:
            newer(job_id, plan_version)
        names = meta.get("names")
        if names is not None and (not isinstance(names, list) or len(names) > MAX_NAMES
                                  or not all(isinstance(n, str) for n in names)):
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
        chunk_meta: dict[str, Any] = {}
        if names is not None:  # a chunk: only those names, and the hash of the whole piece they belong to
            chunk_meta["whole_sha256"] = digest(tensors)[0]
            wanted = set(names)
            tensors = {k: t for k, t in tensors.items() if k[2:] in wanted}
            if not tensors:
                return Message(kind=KIND + ".err", meta={"error": "none of those names in those blocks"})
        sha, nbytes = digest(tensors)
        return Message(
            kind=KIND + ".ok",
            meta={"round": piece.round, "step": piece.step, "sha256": sha, "nbytes": nbytes, "names": sorted(tensors),
                  **chunk_meta},
            tensors=tensors,
        )

    transport.serve(KIND, handle)
    transport.serve(HEAD_KIND, head)


def state_heads(
    transport: Transport, holders: Iterable[str], *, job_id: str, start: int, end: int, timeout: float,
    plan_version: int | None = None,
) -> dict[str, tuple[int, int]]:
    """``(round, step)`` of the committed state each of ``holders`` holds for blocks ``[start, end)``, asked of
    all of them at once (``state.head``: a few bytes each way, no tensor). A holder that does not answer
    within ``timeout``, or answers anything but two plain integers, is left out."""
    import concurrent.futures

    holders = list(holders)
    ask: dict[str, Any] = {"job_id": job_id, "start": start, "end": end}
    if plan_version is not None:
        ask["plan_version"] = plan_version

    def one(peer: str) -> tuple[int, int] | None:
        try:
            reply = transport.request(peer, Message(kind=HEAD_KIND, meta=dict(ask)), timeout=timeout)
        except TransportError as e:
            logger.debug("state.head of %s: %s", peer, e)
            return None
        rnd, step = reply.meta.get("round"), reply.meta.get("step")
        if reply.kind != HEAD_KIND + ".ok" or type(rnd) is not int or type(step) is not int or rnd < 0 or step < 0:
            return None
        return rnd, step

    if not holders:
        return {}
    with concurrent.futures.ThreadPoolExecutor(min(8, len(holders)), thread_name_prefix="gt-head") as pool:
        answers = dict(zip(holders, pool.map(one, holders), strict=True))
    return {p: a for p, a in answers.items() if a is not None}


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
    sizes: Mapping[str, int] | None = None,
    parallel: int = 1,
    plan_version: int | None = None,
    min_round: int | None = None,
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

    ``parallel`` > 1 (with ``need``, ``sizes``: elements per name, and nothing in ``have``): the names are
    cut into that many chunks of about equal bytes, asked of that many donors at once (a chunk a donor
    cannot give goes to the next donor). Every donor also sends the SHA-256 of the whole piece it holds;
    chunks are kept only from donors of the best donor's round, step and whole-piece hash, and the
    assembled state must hash to it: one donor's state, verified whole, fetched over several links. If
    that cannot be had, donors are asked one at a time as without ``parallel``.

    ``min_round``: a reply of an older committed round is refused (the asker knows a newer one exists).

    ``plan_version``: the plan the asker follows, told to each donor (a donor that has not read that plan
    yet reads it now: :func:`serve_state`'s ``newer``).
    """
    need = list(need)
    donors = list(donors)
    if parallel > 1 and need and sizes and have is None and len(donors) > 1 and len(need) > 1:
        try:
            return _fetch_chunked(transport, donors, job_id=job_id, start=start, end=end, need=need, sizes=sizes,
                                  timeout=timeout, step=step, min_step=min_step, parallel=parallel,
                                  plan_version=plan_version, min_round=min_round)
        except StateTransferError as e:
            logger.info("blocks [%d, %d): chunked fetch failed (%s); asking one donor at a time", start, end, e)
    state = have
    errors = []
    for donor in donors:
        if state is not None and (state.covers(need) if need else state.params):
            break
        got_or_error = _ask(transport, donor, job_id=job_id, start=start, end=end, timeout=timeout, step=step,
                            min_step=min_step, plan_version=plan_version, min_round=min_round)
        if isinstance(got_or_error, str):
            errors.append(got_or_error)
            continue
        got = got_or_error.state
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


@dataclass
class _Reply:
    """One verified ``state.get`` reply: the state it carries and the donor's hash of its whole piece."""

    state: StageState
    whole: str | None


def _ask(
    transport: Transport, donor: str, *, job_id: str, start: int, end: int, timeout: float, step: int | None,
    min_step: int | None, names: list[str] | None = None, plan_version: int | None = None,
    min_round: int | None = None,
) -> _Reply | str:
    """Ask ``donor`` for blocks ``[start, end)`` (only ``names``, if given); a verified reply, or why not."""
    ask: dict[str, Any] = {"job_id": job_id, "start": start, "end": end}
    if step is not None:
        ask["step"] = step
    if plan_version is not None:
        ask["plan_version"] = plan_version
    if names is not None:
        ask["names"] = names
    try:
        reply = transport.request(donor, Message(kind=KIND, meta=ask), timeout=timeout)
    except TransportError as e:
        return f"{donor}: {e}"
    meta = reply.meta
    if reply.kind != KIND + ".ok":
        return f"{donor}: {meta.get('error', reply.kind)}"
    sha, nbytes = digest(reply.tensors)
    if sorted(reply.tensors) != meta.get("names") or nbytes != meta.get("nbytes") or sha != meta.get("sha256"):
        logger.warning("state from %s failed verification; trying the next donor", donor)
        return f"{donor}: state failed verification (size or hash mismatch)"
    if step is not None and meta.get("step") != step:
        return f"{donor}: state of step {meta.get('step')}, not {step}"
    if min_step is not None and int(meta.get("step", 0)) < min_step:
        return f"{donor}: stale state of step {meta.get('step')}, before step {min_step}"
    if min_round is not None and int(meta.get("round", 0)) < min_round:
        return f"{donor}: state of round {meta.get('round')}, older than round {min_round}"
    params = {k[2:]: v for k, v in reply.tensors.items() if k.startswith("p:")}
    momentum = {k[2:]: v for k, v in reply.tensors.items() if k.startswith("o:")}
    if names is not None and sorted(params) != sorted(names):
        return f"{donor}: holds {len(params)} of the {len(names)} names asked"
    whole = meta.get("whole_sha256")
    return _Reply(StageState(job_id, int(meta.get("round", 0)), int(meta.get("step", 0)), params, momentum),
                  whole if isinstance(whole, str) else None)


def split_by_size(names: list[str], sizes: Mapping[str, int], parts: int) -> list[list[str]]:
    """``names`` in ``parts`` non-empty chunks of about equal total size (largest first into the lightest)."""
    parts = max(1, min(parts, len(names)))
    bins: list[list[str]] = [[] for _ in range(parts)]
    load = [0] * parts
    for n in sorted(names, key=lambda n: (-sizes.get(n, 0), n)):
        k = min(range(parts), key=lambda b: (load[b], b))
        bins[k].append(n)
        load[k] += sizes.get(n, 0)
    return [sorted(b) for b in bins if b]


def _fetch_chunked(
    transport: Transport, donors: list[str], *, job_id: str, start: int, end: int, need: list[str],
    sizes: Mapping[str, int], timeout: float, step: int | None, min_step: int | None, parallel: int,
    plan_version: int | None = None, min_round: int | None = None,
) -> StageState:
    import concurrent.futures

    chunks = split_by_size(need, sizes, min(parallel, len(donors)))
    tried: dict[int, set[int]] = {i: set() for i in range(len(chunks))}
    got: dict[int, tuple[int, _Reply]] = {}  # chunk -> (donor index, reply)
    errors: list[str] = []

    def ask(i: int, d: int) -> _Reply | str:
        return _ask(transport, donors[d], job_id=job_id, start=start, end=end, timeout=timeout, step=step,
                    min_step=min_step, names=chunks[i], plan_version=plan_version, min_round=min_round)

    def next_donor(i: int) -> int | None:
        # chunk i starts at donor i (the chunks spread over the best donors), then the others in order
        for d in [i % len(donors), *range(len(donors))]:
            if d not in tried[i]:
                return d
        return None

    with concurrent.futures.ThreadPoolExecutor(len(chunks), thread_name_prefix="gt-fetch") as pool:
        pending = list(range(len(chunks)))
        while pending:
            asked = {}
            for i in pending:
                d = next_donor(i)
                if d is None:
                    raise StateTransferError(f"no donor gave chunk {i} of blocks [{start}, {end}): "
                                             + "; ".join(errors[-4:]))
                tried[i].add(d)
                asked[i] = (d, pool.submit(ask, i, d))
            pending = []
            for i, (d, fut) in asked.items():
                reply = fut.result()
                if isinstance(reply, str) or reply.whole is None:
                    errors.append(reply if isinstance(reply, str) else f"{donors[d]}: no whole-piece hash")
                    pending.append(i)
                else:
                    got[i] = (d, reply)
    # the best donor that answered sets the reference; a chunk from a donor of another round (or whose whole
    # piece hashes otherwise) is asked of that donor again
    best_d, best = min(got.values(), key=lambda dr: dr[0])
    key = (best.state.round, best.state.step, best.whole)
    for i, (_, reply) in list(got.items()):
        if (reply.state.round, reply.state.step, reply.whole) != key:
            again = ask(i, best_d)
            if isinstance(again, str) or (again.state.round, again.state.step, again.whole) != key:
                raise StateTransferError(f"chunk {i} of blocks [{start}, {end}) not to be had at round "
                                         f"{best.state.round} from {donors[best_d]}")
            got[i] = (best_d, again)
    params: dict[str, torch.Tensor] = {}
    momentum: dict[str, torch.Tensor] = {}
    for _, reply in got.values():
        params.update(reply.state.params)
        momentum.update(reply.state.momentum)
    tensors = {f"p:{n}": t for n, t in params.items()} | {f"o:{n}": t for n, t in momentum.items()}
    if digest(tensors)[0] != best.whole:
        raise StateTransferError(f"the chunks of blocks [{start}, {end}) do not make the donors' whole piece")
    used = sorted({donors[d] for d, _ in got.values()})
    logger.info("blocks [%d, %d): %d chunks from %d donors (%s)", start, end, len(chunks), len(used), ", ".join(used))
    return StageState(job_id, best.state.round, best.state.step, params, momentum)
