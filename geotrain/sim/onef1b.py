"""One pipeline's inner step, microbatch by microbatch: a discrete-event 1F1B schedule.

The planner's cost model prices an inner step with a closed form (fill/drain
plus ``M - 1`` bottleneck periods). This module plays the schedule out event
by event, so the closed form can be checked and so a simulation can use the
exact timing when a pipeline is small enough to afford it.

Model. Stage ``s`` runs its ops in 1F1B order: ``min(S - s - 1, M)`` warm-up
forwards, then alternating one forward / one backward, then the remaining
backwards. A forward takes ``fwd_s[s]``, a backward ``bwd_s[s]`` (training is
1:2). A forward needs the previous stage's activations, a backward the next
stage's activation gradients. Each hop is a FIFO link: a message starts when
it is ready and the link is free, occupies it ``bytes / bandwidth``, and
arrives ``rtt / 2`` later. ``duplex=False`` makes activations and gradients
share one FIFO per hop (the planner's bound); ``duplex=True`` gives each
direction its own.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from geotrain.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class PipelineTiming:
    """Per-stage op times and per-hop link figures of one pipeline (hop ``h`` joins stage h and h+1)."""

    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    hop_bytes: tuple[float, ...]  # one message, one direction, per microbatch (after the codec)
    hop_bytes_per_s: tuple[float, ...]
    hop_rtt_s: tuple[float, ...]
    microbatches: int
    duplex: bool = False
    tail_s: float = 0.0  # after the schedule, e.g. the tied-embedding gradient exchange of first and last stage

    def __post_init__(self) -> None:
        S = len(self.fwd_s)
        if S < 1 or len(self.bwd_s) != S:
            raise ConfigError("fwd_s and bwd_s need one entry per stage")
        if not len(self.hop_bytes) == len(self.hop_bytes_per_s) == len(self.hop_rtt_s) == S - 1:
            raise ConfigError(f"a pipeline of {S} stages has {S - 1} hops; give hop figures for each")
        if self.microbatches < 1:
            raise ConfigError(f"microbatches must be >= 1; got {self.microbatches}")
        if any(b <= 0 for b in self.hop_bytes_per_s):
            raise ConfigError("hop bandwidths must be > 0")


def one_f_one_b_order(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The ops of ``stage`` in 1F1B order: ``[("F", 0), ("F", 1), ("B", 0), ...]``."""
    warm = min(stages - stage - 1, microbatches)
    ops = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < microbatches:
        ops.append(("F", f))
        f += 1
        ops.append(("B", b))
        b += 1
    ops.extend(("B", i) for i in range(b, microbatches))
    return ops


def simulate_step(t: PipelineTiming) -> float:
    """Seconds from the first forward to the last backward of one inner step."""
    S, M = len(t.fwd_s), t.microbatches
    ops = [one_f_one_b_order(s, S, M) for s in range(S)]
    nxt = [0] * S
    busy = [False] * S
    have_act: list[set[int]] = [set() for _ in range(S)]  # microbatches whose activations reached stage s
    have_grad: list[set[int]] = [set() for _ in range(S)]
    # link FIFOs: key (hop, direction); direction 0 = forward, 1 = backward (shared if not duplex)
    free_at: dict[tuple[int, int], float] = {}
    events: list[tuple[float, int, str, int, int]] = []  # (time, seq, kind, stage, microbatch)
    seq = 0
    done_at = 0.0

    def push(time: float, kind: str, stage: int, mb: int) -> None:
        nonlocal seq
        heapq.heappush(events, (time, seq, kind, stage, mb))
        seq += 1

    def try_start(s: int, now: float) -> None:
        if busy[s] or nxt[s] >= len(ops[s]):
            return
        kind, mb = ops[s][nxt[s]]
        ready = (s == 0 or mb in have_act[s]) if kind == "F" else (s == S - 1 or mb in have_grad[s])
        if not ready:
            return
        busy[s] = True
        nxt[s] += 1
        push(now + (t.fwd_s[s] if kind == "F" else t.bwd_s[s]), "done" + kind, s, mb)

    def send(hop: int, direction: int, now: float, to: int, kind: str, mb: int) -> None:
        key = (hop, direction if t.duplex else 0)
        start = max(now, free_at.get(key, 0.0))
        free_at[key] = start + t.hop_bytes[hop] / t.hop_bytes_per_s[hop]
        push(free_at[key] + t.hop_rtt_s[hop] / 2.0, kind, to, mb)

    for s in range(S):
        try_start(s, 0.0)
    while events:
        now, _, kind, s, mb = heapq.heappop(events)
        if kind == "doneF":
            busy[s] = False
            if s < S - 1:
                send(s, 0, now, s + 1, "act", mb)
        elif kind == "doneB":
            busy[s] = False
            done_at = max(done_at, now)
            if s > 0:
                send(s - 1, 1, now, s - 1, "grad", mb)
        elif kind == "act":
            have_act[s].add(mb)
        else:  # grad
            have_grad[s].add(mb)
        for stage in (s - 1, s, s + 1):
            if 0 <= stage < S:
                try_start(stage, now)
    assert all(n == len(o) for n, o in zip(nxt, ops, strict=True)), "1F1B schedule deadlocked"
    return done_at + t.tail_s


def timing_from_plan(cm: object, pipeline: Sequence[object], *, duplex: bool = False) -> PipelineTiming:
    """The :class:`PipelineTiming` of one planned pipeline under a planner ``CostModel``."""
    from geotrain.planner.costmodel import CostModel, StageAssignment

    assert isinstance(cm, CostModel)
    stages = [st for st in pipeline if isinstance(st, StageAssignment)]
    comp = [cm.stage_compute_s(st.layers[0], st.layers[1], cm.flops_of[st.peer]) for st in stages]
    links = [cm.sc.link(a.peer, b.peer) for a, b in zip(stages, stages[1:], strict=False)]
    if any(ln is None for ln in links):
        raise ConfigError("a hop of this pipeline has no link")
    tail = 0.0
    if cm.tied and len(stages) > 1:
        ends = cm.sc.link(stages[0].peer, stages[-1].peer)
        if ends is None:
            raise ConfigError("tied embeddings need a link between the first and last stage")
        # both send at once: one way each on a duplex link, both on one shared FIFO otherwise
        tail = (1.0 if duplex else 2.0) * cm.tied / ends.bytes_per_s + (ends.rtt_s / 2 if duplex else ends.rtt_s)
    return PipelineTiming(
        fwd_s=tuple(c / 3.0 for c in comp),
        bwd_s=tuple(2.0 * c / 3.0 for c in comp),
        hop_bytes=tuple(cm.hop_bytes(a.layers[1]) / cm.hop_ratio(a.peer, b.peer)
                        for a, b in zip(stages, stages[1:], strict=False)),
        hop_bytes_per_s=tuple(ln.bytes_per_s for ln in links if ln is not None),
        hop_rtt_s=tuple(ln.rtt_s for ln in links if ln is not None),
        microbatches=cm.M,
        duplex=duplex,
        tail_s=tail,
    )
