"""Baseline assignments, scored by the same cost model and layer-split DP as the planner.

Each baseline gets the shape (stages S x pipelines P) of the planner's own
answer, so the comparison is about who goes where:

- ``random``: a seeded random choice and order of peers;
- ``round_robin``: peers in id order dealt across pipelines (peer k goes to
  pipeline k mod P), the way a naive launcher fills ranks;
- ``greedy_region``: regions with the most compute first, fastest peers first,
  pipelines filled region by region;
- ``genetic``: DT-FM-style search (Yuan et al. 2022). An individual is an
  order of all peers; its first S x P peers are cut into S data-parallel
  groups of P (our stage groups). Decoding: the pipeline cost between two
  groups is a bottleneck bipartite matching of their peers over link time;
  the groups are ordered as an open-loop travelling-salesman path over those
  costs; pipelines follow the matchings. Fitness is the planner's objective.
  Tournament selection, order crossover, swap mutation, elitism; it stops
  after ``stall`` generations without improvement, ``generations`` or
  ``time_budget_s``.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from geotrain.planner.search import Candidate, Scorer
from geotrain.planner.split import Grid


def random_baseline(score: Scorer, ids: Sequence[str], S: int, P: int, *, seed: int = 0, tries: int = 20) -> Candidate | None:
    rng = random.Random(seed)
    for _ in range(tries):
        order = list(ids)
        rng.shuffle(order)
        c = score(tuple(tuple(order[p * S:(p + 1) * S]) for p in range(P)))
        if c is not None:
            return c
    return None


def round_robin(score: Scorer, ids: Sequence[str], S: int, P: int) -> Candidate | None:
    order = sorted(ids)[:S * P]
    return score(tuple(tuple(order[s * P + p] for s in range(S)) for p in range(P)))


def greedy_region(score: Scorer, ids: Sequence[str], S: int, P: int) -> Candidate | None:
    peers = score.cm.sc._peer
    power: dict[str, float] = {}
    for q in ids:
        power[peers[q].region] = power.get(peers[q].region, 0.0) + peers[q].flops
    order = sorted(ids, key=lambda q: (-power[peers[q].region], peers[q].region, -peers[q].flops, q))[:S * P]
    return score(tuple(tuple(order[p * S:(p + 1) * S]) for p in range(P)))


# -- genetic ----------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class GeneticConfig:
    population: int = 32
    generations: int = 300
    stall: int = 40  # generations without improvement before stopping
    mutation: float = 0.3
    elite: int = 2
    time_budget_s: float = 120.0

    def __post_init__(self) -> None:
        if self.population < 4 or self.elite >= self.population:
            raise ValueError("genetic.population must be >= 4 and > elite")


def _bottleneck_matching(cost: list[list[float]]) -> tuple[float, list[int]]:
    """Perfect matching rows->cols minimising the largest cost (threshold search + augmenting paths)."""
    n = len(cost)
    values = sorted({c for row in cost for c in row})
    lo, hi, best = 0, len(values) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        match = _perfect(cost, values[mid])
        if match is not None:
            best, hi = (values[mid], match), mid - 1
        else:
            lo = mid + 1
    if best is None:
        return float("inf"), list(range(n))
    return best


def _perfect(cost: list[list[float]], limit: float) -> list[int] | None:
    n = len(cost)
    owner = [-1] * n  # col -> row

    def augment(r: int, seen: list[bool]) -> bool:
        for c in range(n):
            if cost[r][c] <= limit and not seen[c]:
                seen[c] = True
                if owner[c] < 0 or augment(owner[c], seen):
                    owner[c] = r
                    return True
        return False

    for r in range(n):
        if not augment(r, [False] * n):
            return None
    match = [0] * n
    for c, r in enumerate(owner):
        match[r] = c
    return match


def decode(score: Scorer, genome: Sequence[str], S: int, P: int) -> Grid:
    """Groups -> TSP path over bottleneck-matching costs -> pipelines along the matchings."""
    sc = score.cm.sc
    hop = max(score.cm.hop_bytes(b) for b in range(1, score.cm.n_layers))
    groups = [list(genome[s * P:(s + 1) * P]) for s in range(S)]

    def t(a: str, b: str) -> float:
        ln = sc.link(a, b)
        return float("inf") if ln is None else 2.0 * hop / (ln.bytes_per_s * score.cm.hop_ratio(a, b)) + ln.rtt_s

    pair: dict[tuple[int, int], tuple[float, list[int]]] = {}
    for i, j in itertools.permutations(range(S), 2):
        pair[(i, j)] = _bottleneck_matching([[t(a, b) for b in groups[j]] for a in groups[i]])
    order = _open_tsp(S, lambda i, j: pair[(i, j)][0])
    rows = [[groups[order[0]][p]] for p in range(P)]
    idx = list(range(P))
    for k in range(S - 1):
        match = pair[(order[k], order[k + 1])][1]
        idx = [match[i] for i in idx]
        for p in range(P):
            rows[p].append(groups[order[k + 1]][idx[p]])
    return tuple(tuple(r) for r in rows)


def _open_tsp(n: int, w: Callable[[int, int], float]) -> list[int]:
    """Shortest open path through all nodes: exact (Held-Karp) up to 10 nodes, else nearest neighbour + 2-opt."""
    if n <= 2:
        return list(range(n))
    if n <= 10:
        inf = float("inf")
        dp = {(1 << i, i): (0.0, -1) for i in range(n)}
        for mask in range(1, 1 << n):
            for last in range(n):
                if (mask, last) not in dp:
                    continue
                base = dp[(mask, last)][0]
                for nxt in range(n):
                    if mask & (1 << nxt):
                        continue
                    key = (mask | (1 << nxt), nxt)
                    v = base + w(last, nxt)
                    if v < dp.get(key, (inf, -1))[0]:
                        dp[key] = (v, last)
        full = (1 << n) - 1
        last = min(range(n), key=lambda i: dp[(full, i)][0])
        path, mask = [], full
        while last >= 0:
            path.append(last)
            prev = dp[(mask, last)][1]
            mask ^= 1 << last
            last = prev
        return path[::-1]
    path = [0]
    left = set(range(1, n))
    while left:
        nxt = min(left, key=lambda j: w(path[-1], j))
        path.append(nxt)
        left.remove(nxt)
    improved = True
    while improved:
        improved = False
        for i, j in itertools.combinations(range(n), 2):
            cand = path[:i] + path[i:j + 1][::-1] + path[j + 1:]
            if sum(w(a, b) for a, b in itertools.pairwise(cand)) < sum(w(a, b) for a, b in itertools.pairwise(path)) - 1e-12:
                path, improved = cand, True
    return path


def genetic(score: Scorer, ids: Sequence[str], S: int, P: int, *, seed: int = 0,
            config: GeneticConfig | None = None) -> Candidate | None:
    cfg = config or GeneticConfig()
    rng = random.Random(seed)
    deadline = time.monotonic() + cfg.time_budget_s
    n = len(ids)

    def fitness(genome: list[str]) -> tuple[float, Candidate | None]:
        c = score(decode(score, genome, S, P))
        return (float("inf"), None) if c is None else (c.score, c)

    pop = []
    for _ in range(cfg.population):
        g = list(ids)
        rng.shuffle(g)
        pop.append((g, *fitness(g)))
    pop.sort(key=lambda x: x[1])
    best_score, stall = pop[0][1], 0
    for _ in range(cfg.generations):
        if stall >= cfg.stall or time.monotonic() > deadline:
            break
        nxt = pop[:cfg.elite]
        while len(nxt) < cfg.population:
            a = min(rng.sample(pop, 3), key=lambda x: x[1])[0]
            b = min(rng.sample(pop, 3), key=lambda x: x[1])[0]
            child = _order_crossover(a, b, rng)
            while rng.random() < cfg.mutation:
                i, j = rng.randrange(n), rng.randrange(n)
                child[i], child[j] = child[j], child[i]
            nxt.append((child, *fitness(child)))
        pop = sorted(nxt, key=lambda x: x[1])
        if pop[0][1] < best_score - 1e-12 * abs(best_score):
            best_score, stall = pop[0][1], 0
        else:
            stall += 1
    return pop[0][2]


def _order_crossover(a: list[str], b: list[str], rng: random.Random) -> list[str]:
    n = len(a)
    i, j = sorted(rng.sample(range(n + 1), 2)) if n > 1 else (0, n)
    middle = a[i:j]
    taken = set(middle)
    rest = [q for q in b if q not in taken]
    return rest[:i] + middle + rest[i:]
