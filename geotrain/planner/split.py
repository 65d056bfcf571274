"""Layer split: which contiguous layers each stage runs, by dynamic programming.

Given a *grid* (pipelines x stages -> peer ids), every pipeline uses the same
split, so that the peers holding stage ``s`` in all pipelines hold the same
layers and form one stage group. Pipelines wait for each other at every
round, so stage ``s`` runs at the speed of its slowest peer (column minimum
of FLOP/s, and of memory), and the hop after stage ``s`` at its slowest link.

The split minimises the pipeline's bottleneck period ``B`` (the term that
multiplies ``M - 1`` in the 1F1B step time; see ``costmodel``):

.. math::
   \\mathrm{dp}[s][j] = \\min_{i<j} \\max\\big(\\mathrm{dp}[s-1][i],\\ h_{s-1}(i),\\ m F(i,j)/\\phi_s\\big)

where ``F(i, j)`` sums FLOPs per token over layers ``[i, j)``, ``phi_s`` is
stage ``s``'s slowest peer, ``h_{s-1}(i)`` is the link time of the hop whose
activations leave layer ``i - 1``, and ranges that do not fit stage ``s``'s
smallest memory are skipped. O(S L^2) for S stages and L layers.

*Rounds in the split.* A stage group's round moves its stage's whole
pseudo-gradient, so when rounds are frequent (``H`` small) a stage's share of
parameters matters as much as its share of FLOPs. :func:`sync_terms` prices
each column's round as ``Y_s = alpha_s N_s + beta_s`` seconds for ``N_s``
parameters and the DP can add ``Y_s / K`` to stage ``s``'s term, ``K`` the
inner-step periods a round has to hide behind (``tau (M - 1 + S)``, or
``H (M - 1 + S)`` when the round blocks). That term is a surrogate (the cost
model adds the exposed part of the slowest group's round to the step, not a
max per stage), so the search scores the split with and without it and keeps
the better plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from geotrain.planner.costmodel import CostModel, StageAssignment

Grid = tuple[tuple[str, ...], ...]


def column_key(cm: CostModel, grid: Sequence[Sequence[str]]) -> tuple[tuple[float, ...], ...] | None:
    """What the split depends on: per stage (min FLOP/s, min memory) and per hop (max 2 / (bandwidth x codec ratio))."""
    sc = cm.sc
    peers = sc._peer
    S = len(grid[0])
    speed, memory, kappa = [], [], []
    if cm.tied and S > 1 and any(sc.link(row[0], row[-1]) is None for row in grid):
        return None
    for s in range(S):
        speed.append(min(peers[row[s]].flops for row in grid))
        memory.append(min(peers[row[s]].memory_bytes for row in grid))
        if s + 1 < S:
            worst = 0.0
            for row in grid:
                ln, back = sc.link(row[s], row[s + 1]), sc.link(row[s + 1], row[s])
                if ln is None or back is None:
                    return None
                worst = max(worst, (1.0 / ln.bytes_per_s + 1.0 / back.bytes_per_s) / cm.hop_ratio(row[s], row[s + 1]))
            kappa.append(worst)
    return tuple(speed), tuple(memory), tuple(kappa)


def sync_terms(cm: CostModel, grid: Sequence[Sequence[str]]) -> tuple[tuple[float, float], ...] | None:
    """Per column, ``(alpha, beta)`` with its round's surrogate period ``alpha x param bytes + beta`` (see above).

    None when there is one pipeline (no rounds) or a column has no links between its regions.
    """
    P, S = len(grid), len(grid[0])
    if P < 2:
        return None
    job = cm.sc.job
    hidden = job.hidden_steps
    periods = (max(1, hidden) if hidden else job.sync_every) * max(1, cm.M - 1 + S)
    total = cm.params[-1] / cm.d  # elements of the whole model
    ref = max(1.0, total / S)
    out = []
    for s in range(S):
        members = [row[s] for row in grid]
        y0 = cm._group_sync(members, 0.0, {})
        y1 = cm._group_sync(members, ref, {})
        if y0 is None or y1 is None:
            return None
        # per parameter *byte* of the profile (the DP walks prefix sums of param bytes)
        out.append(((y1 - y0) / ref / cm.d / periods, y0 / periods))
    return tuple(out)


def split_layers(
    cm: CostModel, key: tuple[Any, ...], cache: dict[object, tuple[int, ...] | None] | None = None
) -> tuple[int, ...] | None:
    """Stage boundaries ``(b_0, ..., b_{S-1} = L)`` minimising the bottleneck, or None if nothing fits."""
    if cache is not None and key in cache:
        return cache[key]
    speed, memory, kappa = key[:3]
    sync = key[3] if len(key) > 3 else ()
    S, L = len(speed), cm.n_layers
    P_ = cm.params
    result: tuple[int, ...] | None = None
    if S <= L:
        inf = math.inf
        m, F = cm.m, cm.flops
        # dp[j]: best bottleneck covering layers [0, j) with stages 0..s; back[s][j]: where stage s starts
        dp = [inf] * (L + 1)
        for j in range(1, L - S + 2):
            if cm.stage_memory(0, j, 0, S) <= memory[0]:
                dp[j] = m * F[j] / speed[0]
                if sync:
                    dp[j] = max(dp[j], sync[0][0] * P_[j] + sync[0][1])
        back: list[list[int]] = [[0] * (L + 1)]
        for s in range(1, S):
            new = [inf] * (L + 1)
            arg = [0] * (L + 1)
            hop = [kappa[s - 1] * cm.hop_bytes(i) if i > 0 else inf for i in range(L + 1)]
            phi, mem = speed[s], memory[s]
            for j in range(s + 1, L - (S - 1 - s) + 1):
                best, at = inf, 0
                # walk i downwards: the stage [i, j) grows, so once it stops fitting memory it never fits again
                for i in range(j - 1, s - 1, -1):
                    c = m * (F[j] - F[i]) / phi
                    if c >= best:
                        break  # compute only grows as i decreases
                    if cm.stage_memory(i, j, s, S) > mem:
                        break
                    v = max(dp[i], hop[i], c)
                    if sync:
                        v = max(v, sync[s][0] * (P_[j] - P_[i]) + sync[s][1])
                    if v < best:
                        best, at = v, i
                new[j], arg[j] = best, at
            dp = new
            back.append(arg)
        if dp[L] < inf:
            bounds = [L]
            for s in range(S - 1, 0, -1):
                bounds.append(back[s][bounds[-1]])
            result = tuple(reversed(bounds))
    if cache is not None:
        cache[key] = result
    return result


def assign(grid: Sequence[Sequence[str]], bounds: Sequence[int]) -> list[list[StageAssignment]]:
    """Pipelines of :class:`StageAssignment` from a grid and stage boundaries."""
    starts = [0, *bounds[:-1]]
    return [[StageAssignment(peer=q, layers=(a, b)) for q, a, b in zip(row, starts, bounds, strict=True)]
            for row in grid]
