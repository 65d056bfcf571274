"""Assignment search: how many stages and pipelines, and which peer goes where.

A *grid* is the search's plan before layers: ``grid[p][s]`` is the peer of
stage ``s`` in pipeline ``p``; peers not in it are *spares*. Every grid is
turned into a plan by the layer-split DP (``split``) and scored by the cost
model under the objective, so exact search, heuristic and baselines compare
like with like.

- :func:`exhaustive`: every shape (S stages x P pipelines) and every
  arrangement of peers up to swapping whole pipelines. Used when the count is
  small (a few peers).
- :func:`heuristic`: region-aware packing then local search. Pipelines carry
  activations every microbatch and stage groups sync only every H steps, so
  it first packs pipelines inside regions (fast, free links), takes peers by
  the objective's own measure (FLOP/s, or FLOP/s per USD), lines columns up
  by speed so a stage group has no straggler, and chains the leftover peers
  of each region into mixed pipelines along the best-connected region order.
  Then it improves the best shapes by swapping two peers, or a peer and a
  spare, while the score improves.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from geotrain.planner.costmodel import CostModel, Prediction, StageAssignment
from geotrain.planner.objective import Objective
from geotrain.planner.split import Grid, assign, column_key, split_layers, sync_terms

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """A scored grid: its score (lower is better), the plan and its prediction."""

    score: float
    grid: Grid
    pipelines: list[list[StageAssignment]]
    prediction: Prediction


class Scorer:
    """Turns grids into scored candidates, caching splits; counts evaluations.

    It also keeps the *incumbent*, the best candidate it ever scored (:attr:`best`), whoever
    asked: the heuristic, a baseline or an exact search. A search that ends on a local optimum
    can then still return the best plan it saw. ``target`` is the objective the incumbent is
    judged by when the search steers by another one (a constrained objective searched under
    throughput and cost, say); it defaults to ``objective``.
    """

    def __init__(self, cm: CostModel, objective: Objective, *, target: Objective | None = None,
                 shared: Scorer | None = None, per_pipeline: bool = True) -> None:
        self.cm = cm
        self.objective = objective
        # per-pipeline splits: each pipeline's boundaries from its own peers (False: one split for all,
        # the ``uniform_split`` baseline)
        self.per_pipeline = per_pipeline
        self.target = target or objective
        # a scorer steering by another objective shares its split cache and incumbent with ``shared``
        self._root: Scorer = shared._root if shared is not None else self
        self.split_cache: dict[object, tuple[int, ...] | None] = (
            shared.split_cache if shared is not None else {})
        self.evaluations = 0
        self.last_reason = ""
        self.best: Candidate | None = None  # judged by ``target`` (on the root scorer)
        self.infeasible: dict[tuple[int, int], str] = {}  # (stages, pipelines) -> why the last grid failed
        self._seen: dict[Grid, Candidate | None] = {}

    @property
    def incumbent(self) -> Candidate | None:
        """The best candidate any scorer sharing this one's root has scored, under the target objective."""
        return self._root.best

    def offer(self, c: Candidate) -> None:
        """Make ``c`` (scored elsewhere, by any objective) a candidate for the incumbent."""
        self._offer(c)

    def _offer(self, c: Candidate) -> None:
        root = self._root
        score = root.target.score(c.prediction)
        if root.best is None or score < root.best.score:
            root.best = Candidate(score, c.grid, c.pipelines, c.prediction)

    def _fail(self, grid: Grid, why: str) -> None:
        self.last_reason = why
        self._root.last_reason = why
        if grid:
            self.infeasible[(len(grid[0]), len(grid))] = why

    def __call__(self, grid: Grid) -> Candidate | None:
        self.evaluations += 1
        self._root.evaluations += self is not self._root
        # the same grid comes back often (orders that agree on a uniform swarm, moves undone): score it once
        if grid in self._seen:
            return self._seen[grid]
        c = self._score(grid)
        if len(self._seen) < _SEEN_LIMIT:
            self._seen[grid] = c
        return c

    def _score(self, grid: Grid) -> Candidate | None:
        key = column_key(self.cm, grid)
        if key is None:
            self._fail(grid, "a pipeline hop joins peers with no link between them")
            return None
        bounds = split_layers(self.cm, key, self.split_cache)
        c = None if bounds is None else self._candidate(grid, bounds)
        if c is not None and bounds is not None and c.prediction.exposed_sync_s > 0:
            # rounds that do not hide behind compute: also try the split that weighs each stage's round
            sync = sync_terms(self.cm, grid)
            if sync is not None:
                alt_bounds = split_layers(self.cm, (*key, sync), self.split_cache)
                if alt_bounds is not None and alt_bounds != bounds:
                    alt = self._candidate(grid, alt_bounds)
                    if alt is not None and alt.score < c.score:
                        c = alt
        if self.per_pipeline and 1 < len(grid) <= _PER_PIPELINE_MAX:
            mixed = self._per_pipeline(grid, uniform_fits=c is not None)
            if mixed is not None and (c is None or mixed.score < c.score):
                c = mixed
        if c is None:
            if bounds is None:
                self._fail(grid, _memory_reason(self.cm, grid))
            return None
        self._offer(c)
        return c

    def _per_pipeline(self, grid: Grid, *, uniform_fits: bool) -> Candidate | None:
        """Each pipeline cut for its own peers (speed, memory, links), or None when that is the uniform split.

        Pipelines whose peers are alike get the same boundaries (the same split key), so their
        stage groups stay whole; a pipeline of fast or large peers gets its own. Stage groups
        then form by layer segment (``costmodel``), which the cost model prices exactly.
        """
        peers = self.cm.sc._peer
        if uniform_fits and len({(peers[q].flops, peers[q].memory_bytes) for row in grid for q in row}) == 1:
            return None  # one kind of device: rows differ only by links, not worth a split each
        maybe = [column_key(self.cm, (row,)) for row in grid]
        keys = [k for k in maybe if k is not None]
        if len(keys) < len(maybe) or (uniform_fits and len(set(keys)) == 1):
            return None
        rows_bounds = [split_layers(self.cm, k, self.split_cache) for k in keys]
        if any(b is None for b in rows_bounds):
            return None
        pipes = [assign((row,), b)[0] for row, b in zip(grid, rows_bounds, strict=True) if b is not None]
        pred = self.cm.predict(pipes, detail=False, trusted=True)
        if isinstance(pred, str):
            return None
        return Candidate(self.objective.score(pred), grid, pipes, pred)

    def _candidate(self, grid: Grid, bounds: Sequence[int]) -> Candidate | None:
        pipes = assign(grid, bounds)
        pred = self.cm.predict(pipes, detail=False, trusted=True)
        if isinstance(pred, str):
            self._fail(grid, pred)
            return None
        return Candidate(self.objective.score(pred), grid, pipes, pred)


_SEEN_LIMIT = 50_000  # grids whose score a Scorer remembers
_PATIENCE = 200  # sampled moves without a gain before a local search stops
_PER_PIPELINE_MAX = 64  # more pipelines than this keep one split (a split each costs a DP per distinct row)
_KICKS = 20  # iterated local search on small swarms: random double swaps, each followed by a descent


def _memory_reason(cm: CostModel, grid: Grid) -> str:
    """Why no layer split of ``grid`` fits: the smallest peer of the shape against an even share."""
    S = len(grid[0])
    peers = cm.sc._peer
    small = min((q for row in grid for q in row), key=lambda q: (peers[q].memory_bytes, q))
    L = cm.n_layers
    share = cm.stage_memory(0, max(1, -(-L // S)), 0, S)
    return (f"the layers do not fit the peers' memory: {S} stage(s) need about {share / 1e9:.1f} GB a stage "
            f"and {small} has {peers[small].memory_gb:g} GB")


def can_hold(cm: CostModel, peer: str, S: int) -> bool:
    """Whether ``peer`` could hold some stage of an ``S``-stage pipeline: its last stage, layers an even share.

    Exact for ``S = 1`` (the whole model, one microbatch in flight); for more stages a cheap
    screen that keeps packing from filling a shape with peers that cannot hold an even stage.
    """
    L = cm.n_layers
    share = max(1, L // S)
    return cm.stage_memory(L - share, L, S - 1, S) <= cm.sc._peer[peer].memory_bytes


def holders_first(cm: CostModel, order: Sequence[str], S: int) -> list[str]:
    """``order`` with the peers that can hold a stage of an ``S``-stage pipeline first (stable)."""
    fit = [q for q in order if can_hold(cm, q, S)]
    taken = set(fit)
    return fit + [q for q in order if q not in taken]


def shapes(cm: CostModel, n_peers: int, *, dense: bool) -> list[tuple[int, int]]:
    """(stages, pipelines) pairs to try; a geometric ladder of pipeline counts when not ``dense``."""
    job = cm.sc.job
    s_options = [job.stages] if job.stages else list(range(1, min(cm.n_layers, n_peers) + 1))
    out: list[tuple[int, int]] = []
    for S in s_options:
        top = n_peers // S
        if top < 1:
            continue
        if job.pipelines:
            ps = [job.pipelines] if job.pipelines <= top else []
        elif dense or top <= 16:
            ps = list(range(1, top + 1))
        else:
            ps = sorted({max(1, round(top * f)) for f in (1, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)} | {1, 2, 4})
        out.extend((S, P) for P in ps)
    return out


def exhaustive_size(cm: CostModel, n_peers: int) -> int:
    """How many grids :func:`exhaustive` would score."""
    total = 0
    for S, P in shapes(cm, n_peers, dense=True):
        total += math.perm(n_peers, S * P) // math.factorial(P)
    return total


def _arrangements(ids: Sequence[str], S: int, P: int) -> Iterable[Grid]:
    """Every grid of P pipelines x S stages up to the order of pipelines (rows sorted by first peer)."""

    def rec(rows: list[tuple[str, ...]], used: set[str], last_first: str | None) -> Iterable[Grid]:
        if len(rows) == P:
            yield tuple(rows)
            return
        for f in ids:
            if f in used or (last_first is not None and f <= last_first):
                continue
            rest = [q for q in ids if q not in used and q != f]
            for tail in itertools.permutations(rest, S - 1):
                row = (f, *tail)
                yield from rec([*rows, row], used | set(row), f)

    return rec([], set(), None)


def exhaustive(score: Scorer, peer_ids: Sequence[str]) -> Candidate | None:
    """The best grid over every shape and arrangement (pipelines are unordered)."""
    best: Candidate | None = None
    ids = sorted(peer_ids)
    for S, P in shapes(score.cm, len(ids), dense=True):
        for grid in _arrangements(ids, S, P):
            c = score(grid)
            if c is not None and (best is None or c.score < best.score):
                best = c
    return best


# -- heuristic ------------------------------------------------------------------------------------
def _region_order(cm: CostModel, regions: list[str]) -> list[str]:
    """Regions chained greedily by bandwidth, starting from the first, for mixed pipelines."""
    if not regions:
        return []
    order, left = [regions[0]], set(regions[1:])
    while left:
        cur = order[-1]

        def bw(r: str, cur: str = cur) -> float:
            ln = cm.sc.region_link(cur, r)
            return ln.bytes_per_s if ln else 0.0

        nxt = max(sorted(left), key=bw)
        order.append(nxt)
        left.remove(nxt)
    return order


def pack(cm: CostModel, chosen: Sequence[str], S: int, P: int, *, by: str = "flops") -> Grid:
    """Pipelines inside regions first, leftovers chained across regions; columns sorted by ``by``.

    ``by`` is ``"flops"`` (column s gathers similar speeds) or ``"memory"``
    (similar memory: the first stages keep the most microbatches in flight).
    """
    peers = cm.sc._peer
    by_region: dict[str, list[str]] = {}
    for q in chosen:
        by_region.setdefault(peers[q].region, []).append(q)
    rows: list[list[str]] = []
    leftovers: dict[str, list[str]] = {}
    for r, qs in sorted(by_region.items(), key=lambda kv: -len(kv[1])):
        full = len(qs) // S
        rows.extend(list(qs[i * S:(i + 1) * S]) for i in range(full))
        if len(qs) % S:
            leftovers[r] = qs[full * S:]
    chain = [q for r in _region_order(cm, list(leftovers)) for q in leftovers[r]]
    rows.extend(chain[i * S:(i + 1) * S] for i in range(len(chain) // S))
    rows = rows[:P]
    # inside a pipeline, keep region runs together but put faster peers first within a run, so
    # column s gathers similar speeds across pipelines (a stage group runs at its slowest peer)
    return tuple(_sorted_in_region_runs(row, peers, by) for row in rows)


def _sorted_in_region_runs(row: Sequence[str], peers: Mapping[str, Any], by: str = "flops") -> tuple[str, ...]:
    """``row`` with each run of same-region peers kept in place, sorted inside by ``by`` (largest first)."""
    runs: list[list[str]] = []
    for q in row:
        if runs and peers[runs[-1][0]].region == peers[q].region:
            runs[-1].append(q)
        else:
            runs.append([q])

    def key(x: str) -> tuple[float, str]:
        return (-(peers[x].memory_bytes if by == "memory" else peers[x].flops), x)

    return tuple(q for run in runs for q in sorted(run, key=key))


def _region_path(cm: CostModel, regions: Sequence[str]) -> list[str]:
    """An open path through ``regions`` whose slowest link is as fast as it can be made.

    Neighbours on the path share stage groups and hops, and the slowest of those links sets the
    pace, so the path is judged by its narrowest link (seconds per GB), then by their sum:
    nearest neighbour from every start, then 2-opt. ``k <= 10`` regions: nothing to pay.
    """
    rs = sorted(regions)
    if len(rs) <= 2:
        return rs
    key = tuple(rs)
    if key not in cm.path_cache:
        cm.path_cache[key] = _best_path(cm, rs)
    return list(cm.path_cache[key])


def _best_path(cm: CostModel, rs: list[str]) -> list[str]:
    def cost(a: str, b: str) -> float:
        ln = cm.sc.region_link(a, b)
        return math.inf if ln is None else 1e9 / ln.bytes_per_s + ln.rtt_s

    def judge(path: Sequence[str]) -> tuple[float, float]:
        hops = [cost(a, b) for a, b in itertools.pairwise(path)]
        return max(hops), sum(hops)

    best: tuple[tuple[float, float], list[str]] | None = None
    for start in rs:
        path, left = [start], set(rs) - {start}
        while left:
            nxt = min(sorted(left), key=lambda r: cost(path[-1], r))
            path.append(nxt)
            left.remove(nxt)
        improved = True
        while improved:
            improved = False
            for i, j in itertools.combinations(range(len(path)), 2):
                cand = path[:i] + path[i:j + 1][::-1] + path[j + 1:]
                if judge(cand) < judge(path):
                    path, improved = cand, True
        if best is None or judge(path) < best[0]:
            best = (judge(path), path)
    assert best is not None
    return best[1]


def pack_columns(cm: CostModel, chosen: Sequence[str], S: int, P: int) -> Grid:
    """Stage groups inside regions, pipelines along a path of regions: :func:`pack` transposed.

    Peers are laid out region by region along :func:`_region_path` (fastest first inside a
    region) and cut into ``S`` columns of ``P``; every other column is reversed (a snake), so
    where a region's peers end one column and start the next, the hop between them stays in
    the region. This is the right shape when rounds are frequent (``H`` small) or pipelines are
    short: a stage group's all-reduce moves a stage's whole pseudo-gradient, a hop only
    activations. Packing pipelines inside regions instead leaves each column spread over every
    region, and on a swarm with uneven region sizes its leftover pipelines wander through
    many cities.
    """
    peers = cm.sc._peer
    by_region: dict[str, list[str]] = {}
    for q in chosen:
        by_region.setdefault(peers[q].region, []).append(q)
    line = [q for r in _region_path(cm, list(by_region))
            for q in sorted(by_region[r], key=lambda x: (-peers[x].flops, x))][:S * P]
    cols = [line[s * P:(s + 1) * P] for s in range(S)]
    cols = [c if s % 2 == 0 else c[::-1] for s, c in enumerate(cols)]
    return tuple(tuple(cols[s][p] for s in range(S)) for p in range(P))


def pack_regions(cm: CostModel, order: Sequence[str], S: int, P: int) -> Grid:
    """Whole pipelines inside regions, chosen from every peer in ``order``, the fastest pipelines first.

    :func:`pack` fills pipelines from the first S x P peers of an order, so on a swarm of
    equally fast peers spread over uneven regions the peers it takes are scattered (the order
    breaks speed ties by id) and most pipelines chain several cities; where the round trip of
    a pipeline sets its pace (short stages, a long RTT between cities) each such pipeline
    runs at the slowest link's latency. Here every region first offers all the whole pipelines
    its peers make (peers in ``order`` inside a region), the P with the most FLOP/s are taken,
    and only the pipelines still missing are chained from the regions' leftovers along
    :func:`_region_path`, nearest regions together.
    """
    peers = cm.sc._peer
    by_region: dict[str, list[str]] = {}
    for q in order:
        by_region.setdefault(peers[q].region, []).append(q)
    rows: list[tuple[str, ...]] = []
    left: dict[str, list[str]] = {}
    for r, qs in by_region.items():
        full = len(qs) // S
        rows.extend(tuple(qs[i * S:(i + 1) * S]) for i in range(full))
        if len(qs) % S:
            left[r] = qs[full * S:]
    rows.sort(key=lambda row: (-sum(peers[q].flops for q in row), row))
    rows = rows[:P]
    if len(rows) < P and left:
        chain = [q for r in _region_path(cm, list(left)) for q in left[r]]
        rows.extend(tuple(chain[i * S:(i + 1) * S]) for i in range(min(P - len(rows), len(chain) // S)))
    # fastest first inside a row's region runs, as :func:`pack` does, so columns gather like speeds
    return tuple(_sorted_in_region_runs(row, peers) for row in rows)


def pack_speed_columns(cm: CostModel, chosen: Sequence[str], S: int, P: int) -> Grid:
    """Stage groups of like peers: the fastest P form one column, the next P the next, and so on.

    A stage group runs at its slowest member, so on a mix of devices columns of one kind waste
    nothing; the split then gives the fast columns more layers. Inside a column peers are
    ordered by region (along :func:`_region_path`), so pipeline ``p`` takes the same regions'
    peers where the columns share regions.
    """
    peers = cm.sc._peer
    rank = {r: i for i, r in enumerate(_region_path(cm, sorted({peers[q].region for q in chosen})))}
    line = sorted(chosen, key=lambda q: (-peers[q].flops, -peers[q].memory_bytes, q))[:S * P]
    cols = [sorted(line[s * P:(s + 1) * P], key=lambda q: (rank[peers[q].region], q)) for s in range(S)]
    return tuple(tuple(cols[s][p] for s in range(S)) for p in range(P))


def interleave(cm: CostModel, chosen: Sequence[str], S: int, P: int) -> Grid | None:
    """Pipelines that alternate regions stage by stage (row p, stage s from region (p + s) mod k).

    The packing's opposite: worth a try when crossing regions is as cheap as staying (a codec on
    cross-region hops, slow links inside regions).
    """
    peers = cm.sc._peer
    by_region: dict[str, list[str]] = {}
    for q in chosen:
        by_region.setdefault(peers[q].region, []).append(q)
    regions = sorted(by_region)
    k = len(regions)
    if k < 2:
        return None
    rows = []
    for p in range(P):
        row = []
        for s in range(S):
            for j in range(k):
                pool = by_region[regions[(p + s + j) % k]]
                if pool:
                    row.append(pool.pop(0))
                    break
        rows.append(tuple(row))
    return tuple(rows)


def rankings(cm: CostModel, objective: Objective) -> list[Callable[[str], tuple[float, str]]]:
    peers = cm.sc._peer

    def speed(q: str) -> tuple[float, str]:
        return (-peers[q].flops, q)

    def value(q: str) -> tuple[float, str]:
        return (-peers[q].flops / max(peers[q].usd_per_hour, 1e-9), q)

    def memory(q: str) -> tuple[float, str]:
        return (-peers[q].memory_bytes, q)

    if objective.kind in ("cost", "min_tokens_per_s"):
        return [value, speed, memory]
    return [speed, value, memory]


def _neighbours(grid: Grid, spares: Sequence[str]) -> Iterable[tuple[Grid, list[str]]]:
    cells = [(p, s) for p in range(len(grid)) for s in range(len(grid[0]))]
    for (p1, s1), (p2, s2) in itertools.combinations(cells, 2):
        g = [list(r) for r in grid]
        g[p1][s1], g[p2][s2] = g[p2][s2], g[p1][s1]
        yield tuple(tuple(r) for r in g), list(spares)
    for (p, s), k in itertools.product(cells, range(len(spares))):
        g = [list(r) for r in grid]
        sp = list(spares)
        g[p][s], sp[k] = sp[k], g[p][s]
        yield tuple(tuple(r) for r in g), sp


def local_search(score: Scorer, start: Candidate, all_ids: Sequence[str], *, budget: int, rng: random.Random,
                 deadline: float) -> Candidate:
    """Swaps (peer-peer and peer-spare) until a local optimum, the budget or the deadline.

    Steepest descent when the whole neighbourhood fits the budget, else sampled first improvement.
    """
    best = start
    used = {q for row in best.grid for q in row}
    spares = [q for q in all_ids if q not in used]
    n_cells = len(best.grid) * len(best.grid[0])
    full = n_cells * (n_cells - 1) // 2 + n_cells * len(spares) <= budget
    spent = 0
    # sampled moves: give up after this many failures in a row (a local optimum, most likely)
    patience = max(_PATIENCE, 4 * n_cells) if full or n_cells <= 16 else max(_PATIENCE // 2, n_cells)
    while spent < budget and time.monotonic() < deadline:
        if full:
            # small neighbourhoods: steepest descent (first improvement walks into shallow optima)
            step: tuple[Candidate, list[str]] | None = None
            for g, sp in _neighbours(best.grid, spares):
                spent += 1
                c = score(g)
                if c is not None and c.score < (step[0] if step else best).score - 1e-12 * abs(best.score):
                    step = (c, sp)
                if spent >= budget or time.monotonic() >= deadline:
                    break
            if step is None:
                break
            best, spares = step
            continue
        improved = False
        for g, sp in (_random_move(best.grid, spares, rng) for _ in range(min(budget - spent, patience))):
            spent += 1
            c = score(g)
            if c is not None and c.score < best.score - 1e-12 * abs(best.score):
                best, spares, improved = c, sp, True
                break
            if spent >= budget or time.monotonic() >= deadline:
                break
        if not improved:
            break
    return best


def _random_move(grid: Grid, spares: Sequence[str], rng: random.Random) -> tuple[Grid, list[str]]:
    g = [list(r) for r in grid]
    sp = list(spares)
    p1, s1 = rng.randrange(len(g)), rng.randrange(len(g[0]))
    if sp and rng.random() < 0.5:
        k = rng.randrange(len(sp))
        g[p1][s1], sp[k] = sp[k], g[p1][s1]
    else:
        p2, s2 = rng.randrange(len(g)), rng.randrange(len(g[0]))
        g[p1][s1], g[p2][s2] = g[p2][s2], g[p1][s1]
    return tuple(tuple(r) for r in g), sp


def _orders(cm: CostModel, objective: Objective, peer_ids: Sequence[str]) -> list[list[str]]:
    """Peer orders to pack from: by each ranking, then by each ranking with one strong region first."""
    ranked = [sorted(peer_ids, key=rank) for rank in rankings(cm, objective)]
    orders = list(ranked)
    peers = cm.sc._peer
    power: dict[str, float] = {}
    for q in peer_ids:
        power[peers[q].region] = power.get(peers[q].region, 0.0) + peers[q].flops
    strong = sorted(power, key=lambda r: (-power[r], r))[:4] if len(power) > 1 else []
    for base in ranked:
        for r in strong:
            orders.append([q for q in base if peers[q].region == r] + [q for q in base if peers[q].region != r])
    return orders


def _refine_pipelines(score: Scorer, found: list[Candidate], order: Sequence[str], n: int,
                      keep: int) -> list[Candidate]:
    """Refine the pipeline count of the best shapes between the ladder's rungs (the scan skipped them).

    Pattern search: try P +/- step, move while it improves, halve the step; O(log gap) evaluations.
    """
    out = []
    for c in found[:keep]:
        S, P = len(c.grid[0]), len(c.grid)
        top = n // S
        best, step = c, max(1, top // 20)
        s_order = holders_first(score.cm, order, S)
        while True:
            moved = False
            for q in (P + step, P - step):
                if 1 <= q <= top:
                    for g in (pack(score.cm, s_order[:S * q], S, q), pack_columns(score.cm, s_order[:S * q], S, q)):
                        alt = score(g)
                        if alt is not None and alt.score < best.score:
                            best, P, moved = alt, q, True
                    if moved:
                        break
            if moved:
                continue
            if step == 1:
                break
            step //= 2
        out.append(best)
    return out


def heuristic(score: Scorer, peer_ids: Sequence[str], *, seed: int = 0, time_budget_s: float = 10.0,
              keep: int | None = None, stall_stages: int = 4, moves: int | None = None) -> Candidate | None:
    """Region-aware packing for every shape, then local search on the ``keep`` best shapes.

    Shapes are scanned by growing stage count; the scan stops once
    ``stall_stages`` stage counts in a row have not improved the best shape
    (more stages than needed only add fill/drain and hops). Packing starts
    from several peer orders (by the objective's ranking, by speed, by
    memory, and each strong region first); on large swarms the scan uses the
    first order only and the others are tried on the best shapes. Small
    swarms then get iterated local search (kicks of two random swaps) on
    their best few shapes. ``moves`` caps the local searches' evaluations in
    all (default 3,000 per shape on small swarms, 1,500 on large ones); the result depends
    on the wall clock only when ``time_budget_s`` runs out first.
    """
    cm = score.cm
    rng = random.Random(seed)
    deadline = time.monotonic() + time_budget_s
    n = len(peer_ids)
    small = n <= 16
    keep = keep if keep is not None else (1000 if n <= 10 else 8 if small else 2)
    orders = _orders(cm, score.objective, peer_ids)
    # large swarms scan every shape from each ranking (speed, value, memory), not one order only: with
    # one order a shape whose first S x P peers include one that cannot hold a stage was lost
    scan_orders = orders if small else orders[:len(rankings(cm, score.objective))]
    by_stages: dict[int, list[int]] = {}
    for S, P in shapes(cm, n, dense=small):
        by_stages.setdefault(S, []).append(P)
    per_shape: list[Candidate] = []
    best_score, stalled = math.inf, 0
    mixed_speeds = len({cm.sc._peer[q].flops for q in peer_ids}) > 1
    for S, ps in sorted(by_stages.items()):
        found = False
        # peers that cannot hold a stage of this many go last, so they never block a shape that fits
        s_orders = [holders_first(cm, order, S) for order in scan_orders]
        for P in ps:
            shape_best: Candidate | None = None
            starts = [pack(cm, order[:S * P], S, P, by=by) for order in s_orders
                      for by in (("flops", "memory") if small else ("flops",))]
            starts += [pack_columns(cm, order[:S * P], S, P) for order in s_orders[:2]]
            starts += [pack_regions(cm, order, S, P) for order in s_orders[:2]]
            if mixed_speeds:
                starts += [pack_speed_columns(cm, order[:S * P], S, P) for order in s_orders[:2]]
            mixed = interleave(cm, s_orders[0][:S * P], S, P)
            if mixed is not None:
                starts.append(mixed)
            if small:  # a few random grids too: packing can miss memory-feasible shapes on odd swarms
                for _ in range(8):
                    shuffled = list(peer_ids)
                    rng.shuffle(shuffled)
                    starts.append(tuple(tuple(shuffled[p * S:(p + 1) * S]) for p in range(P)))
            for g in dict.fromkeys(starts):
                c = score(g)
                if c is not None and (shape_best is None or c.score < shape_best.score):
                    shape_best = c
            if shape_best is not None:
                per_shape.append(shape_best)
                found = True
                if shape_best.score < best_score:
                    best_score, stalled = shape_best.score, -1
        if found:
            stalled += 1
            if stalled >= stall_stages or time.monotonic() > deadline:
                break
    if not per_shape:
        return None
    per_shape.sort(key=lambda c: c.score)
    if not small and not cm.sc.job.pipelines:
        per_shape = _refine_pipelines(score, per_shape, orders[0], n, keep) + per_shape
        per_shape.sort(key=lambda c: c.score)
    top: list[Candidate] = []
    for c in per_shape[:keep]:
        S, P = len(c.grid[0]), len(c.grid)
        for order in ([] if small else orders[1:]):
            order = holders_first(cm, order, S)
            for alt in (score(pack(cm, order[:S * P], S, P)), score(pack_columns(cm, order[:S * P], S, P))):
                if alt is not None and alt.score < c.score:
                    c = alt
        top.append(c)
    # ``moves`` is the whole local-search budget, shared by the kept shapes
    budget = max(1, moves // len(top)) if moves is not None else (3000 if small else 1500)
    results = []
    for rank, c in enumerate(top):
        c = local_search(score, c, peer_ids, budget=budget, rng=rng, deadline=deadline)
        for _ in range(_KICKS if small and rank < 3 else 0):  # iterated local search: kick, descend, keep if better
            used = {q for row in c.grid for q in row}
            spares = [q for q in peer_ids if q not in used]
            g, _ = _random_move(*_random_move(c.grid, spares, rng), rng)
            kicked = score(g)
            if kicked is None:
                continue
            kicked = local_search(score, kicked, peer_ids, budget=budget, rng=rng, deadline=deadline)
            if kicked.score < c.score:
                c = kicked
        results.append(c)
    return min(results, key=lambda c: c.score)


def add_pipelines(score: Scorer, best: Candidate, peer_ids: Sequence[str], *, rounds: int = 2) -> Candidate:
    """Put spares to work in pipelines of their own shape: pipelines may differ in stage count.

    A swarm of 80 GB and 16 GB cards is best run as 1-stage pipelines on the big ones and longer
    pipelines of small ones, which a rectangular grid cannot hold. From ``best``, the spares are
    packed into every shape (stages x pipelines) that fits them, each split for its own peers,
    and the union with ``best``'s pipelines is scored by the cost model; the best union is kept
    and the spares it leaves are tried again (``rounds`` times). Rounds stay synchronous, so
    extra pipelines pay only when they keep up with the slowest one already there.
    """
    cm = score.cm
    peers = cm.sc._peer
    job = cm.sc.job
    if job.pipelines:
        return best  # a fixed pipeline count leaves no room for more
    # judged by this scorer's objective from here on (``best`` may come from a search steered by another)
    best = Candidate(score.objective.score(best.prediction), best.grid, best.pipelines, best.prediction)
    for _ in range(rounds):
        used = {q for row in best.grid for q in row}
        spares = sorted((q for q in peer_ids if q not in used), key=lambda q: (-peers[q].flops, q))
        if not spares:
            break
        step_best: Candidate | None = None
        for S in ([job.stages] if job.stages else range(1, min(cm.n_layers, len(spares)) + 1)):
            if len(spares) < S:
                continue
            order = holders_first(cm, spares, S)
            top = len(spares) // S
            ladder = range(1, top + 1) if top <= 16 else sorted({max(1, round(top * f / 10)) for f in range(1, 11)})
            for P in ladder:
                for g in {pack(cm, order[:S * P], S, P), pack_speed_columns(cm, order[:S * P], S, P)}:
                    extra = score(g)
                    if extra is None:
                        continue
                    pipes = [*best.pipelines, *extra.pipelines]
                    pred = cm.predict(pipes, detail=False)
                    if isinstance(pred, str):
                        continue
                    c = Candidate(score.objective.score(pred), (*best.grid, *g), pipes, pred)
                    if c.score < (step_best or best).score:
                        step_best = c
        if step_best is None:
            break
        best = step_best
        score._offer(best)
    return best
