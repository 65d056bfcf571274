r"""The cost model: predicted speed and price of a plan on a scenario.

Notation. A plan has pipelines :math:`p = 1..P`; pipeline :math:`p` has stages
:math:`s = 0..S_p-1`, stage :math:`s` run by peer :math:`q_{p,s}` on layers
:math:`[a_s, b_s)`. For layer :math:`l` the profile gives training FLOPs per
token :math:`f_l`, parameter bytes :math:`w_l` and output activation bytes per
token :math:`x_l`. A microbatch holds :math:`m` = micro_batch x seq_len tokens;
an inner step runs :math:`M` microbatches; a round is :math:`H` inner steps.
Peer :math:`q` computes at :math:`\phi_q` FLOP/s; the link between peers
:math:`q, r` has bandwidth :math:`\beta_{qr}` bytes/s and round-trip time
:math:`\rho_{qr}`. The activation codec shrinks activations by
:math:`\kappa_a` (from ``codecs.compression_ratio``); the sync codec
(``job.sync_codec``) sends :math:`e` bytes per fp32 pseudo-gradient element,
the intra-region codec (``job.sync_intra_codec``, the runtime's
``sync.intra_codec``) :math:`e'`.

**Stage compute** per microbatch (forward + backward)

.. math:: C_{p,s} = m \sum_{l=a_s}^{b_s-1} f_l / \phi_{q_{p,s}}

**Hop** :math:`s \to s+1`: activations go forward, their gradients (same size)
come back, each :math:`A_{p,s} = m\,x_{b_s-1}/\kappa_a` bytes (:math:`\kappa_a = 1`
on a hop inside one region: the coordinator sends those uncompressed), so the hop is
busy :math:`D_{p,s} = A_{p,s}/\beta_{q,r} + A_{p,s}/\beta_{r,q}` per microbatch for
:math:`q = q_{p,s}, r = q_{p,s+1}` (links are directional; on a symmetric link
this is FACTS.md's conservative shared-link bound :math:`2A/\beta`; send threads
overlap it with compute).

**1F1B inner step** of pipeline :math:`p`: the first microbatch crosses every
stage and hop forward and back (fill + drain), each later one leaves one
bottleneck period behind the previous. The period is the busiest stage or
link, or a latency loop: in 1F1B, stages :math:`s..e` hold :math:`e-s+1`
microbatches between them, so one period is at least their loop time over
that count (``geotrain.sim.onef1b`` plays the schedule out event by event; this
closed form stays within a few % of it for M >= 16):

.. math::
   W_{s,e} = \frac{\sum_{j=s}^{e} C_{p,j} + \sum_{j=s}^{e-1} (D_{p,j} + \rho_{p,j})}{\min(M, e - s + 1)}, \qquad
   B_p = \max\big(\max_s C_{p,s},\ \max_s D_{p,s},\ \max_{s<e} W_{s,e}\big)

.. math::
   T_p = \sum_s C_{p,s} + \sum_s (D_{p,s} + \rho_{p,s}) + (M-1)\,B_p

All pipelines take part in every round, so the round waits for the slowest:
:math:`T = \max_p T_p`.

**Tied embeddings** (``model.tied_param_bytes`` = :math:`E > 0`): when the
first and last stage are different peers they swap and sum :math:`E` bytes of
gradients after the schedule, adding :math:`2E/\beta + \rho` (first-last
link) to :math:`T_p` and :math:`E` bytes each way to the traffic. A stage
holding both ends holds one copy, so its group's round carries it once.

**Round**. A *stage group* is the set of peers that hold the same layers in
every pipeline (one per pipeline). Its pseudo-gradient has
:math:`N_g = \sum w_l / d` elements. The all-reduce is hierarchical: a reduce
inside each region, an all-reduce between one leader per region, a gather
inside each region. The legs travel with different codecs, as the runtime
sends them (``geotrain.sync.round``): members send their pseudo-gradient to
their leader with the intra codec, :math:`Z'_g = e' N_g` bytes; leaders
exchange shards with the sync codec, :math:`Z_g = e N_g`; leaders forward the
result home as they received it, also :math:`Z_g`. A butterfly all-reduce
among :math:`n` members where member :math:`i` sends a share of :math:`Z_1/n`
to each other member to reduce and of :math:`Z_2/n` to gather, over links
used one after another, takes

.. math:: R(Z_1, Z_2, G) = \max_{i\in G} \sum_{j \in G, j \ne i} \frac{Z_1 + Z_2}{n\,\beta_{ij}} + 2\max_{i,j\in G} \rho_{ij}

(:math:`\frac{n-1}{n} (Z_1 + Z_2)/\beta` on uniform links, the ring's bandwidth
term) and moves :math:`(n-1)(Z_1 + Z_2)` bytes. So
:math:`Y_g = \max_r R(Z'_g, Z_g, G_g \cap r) + R(Z_g, Z_g, \mathrm{leaders}(G_g))`
and the round's sync takes :math:`Y = \max_g Y_g` (groups run at once).
When the sync engine overlaps (``job.overlap_sync``) the round hides behind
the next :math:`\tau` inner steps (``job.overlap_steps``, the runtime's
``sync.overlap``; :math:`H` when unset) and only :math:`\max(0, Y - \tau T)`
shows; otherwise all of :math:`Y` does. The effective inner step is

.. math:: T_{\mathrm{eff}} = T + \mathrm{exposed}(Y) / H, \qquad
          \text{tokens/s} = P\,M\,m / T_{\mathrm{eff}}

**Memory** (hard constraint) of a stage with :math:`N` parameters at dtype
:math:`d` bytes: weights and gradients :math:`2dN`, AdamW moments (fp32)
:math:`8N`, DiLoCo's anchor copy and outer momentum (fp32) :math:`8N`; plus
activations saved for backward for the microbatches in flight, which in 1F1B
is :math:`\min(M, S-s)` at stage :math:`s`, each
:math:`m \sum_l 17\,x_{l-1}` bytes (17 values per hidden unit per token: the
Korthikanti et al. count for a block without recomputation). With
``model.activation_checkpointing`` a stage keeps only each layer's input,
:math:`m \sum_l x_{l-1}` per microbatch in flight, plus one layer's full
:math:`17\,m\,x` while it recomputes, and every layer costs
:math:`\frac{4}{3} f_l` (the forward runs twice). :math:`d` is
``model.dtype_bytes``. This undercounts the head's logits; keep headroom.

**Money**. USD/hour = the prices of the peers in the plan (spares are not
billed: they are released or kept by their owners) + egress: bytes per step
sent from region :math:`r` to another region, at :math:`r`'s price per GB
(or the link's), times steps per hour. USD per 1M tokens = USD/hour /
(tokens/s x 3600) x 1e6.

**Utilisation** of a peer: the busy fraction of its compute,
:math:`M C_{p,s} / T_{\mathrm{eff}}`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from geotrain.errors import InfeasiblePlanError
from geotrain.planner.codecs import compression_ratio, encoded_bytes_per_element
from geotrain.planner.scenario import Link, Scenario

ACTIVATION_SAVE_FACTOR = 17.0
OPTIMIZER_STATE_BYTES_PER_PARAM = 16.0  # AdamW m, v (fp32) + DiLoCo anchor + outer momentum (fp32)
RECOMPUTE_FLOPS_FACTOR = 4.0 / 3.0  # activation checkpointing: forward (1/3 of fwd + bwd) runs twice


@dataclass(frozen=True)
class StageAssignment:
    """One stage of one pipeline: the peer that runs it and its layers ``[start, end)``."""

    peer: str
    layers: tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """What the cost model predicts for a plan (see the module docstring)."""

    tokens_per_s: float
    usd_per_hour: float
    usd_per_mtok: float
    step_s: float  # effective seconds per inner step, exposed sync included
    cross_region_bytes_per_step: float
    bytes_per_region_pair: dict[tuple[str, str], float] = field(default_factory=dict)  # sender, receiver
    utilisation: dict[str, float] = field(default_factory=dict)
    pipeline_step_s: float = 0.0  # 1F1B step of the slowest pipeline, T
    round_sync_s: float = 0.0  # one round's all-reduce, Y
    exposed_sync_s: float = 0.0  # the part of Y not hidden behind compute, per round
    bottleneck: str = ""
    pipeline_steps_s: tuple[float, ...] = ()  # 1F1B step of each pipeline, T_p

    def to_json(self) -> dict[str, Any]:
        """The issue's ``predicted`` object."""
        return {
            "tokens_per_s": self.tokens_per_s,
            "usd_per_hour": self.usd_per_hour,
            "usd_per_mtok": self.usd_per_mtok if math.isfinite(self.usd_per_mtok) else None,
            "step_s": self.step_s,
            "cross_region_bytes_per_step": self.cross_region_bytes_per_step,
        }


def _butterfly_coeff(members: Sequence[str], link: Callable[[str, str], Link | None]) -> tuple[float, float] | None:
    """``(c, r)`` with a butterfly all-reduce of ``z`` bytes among ``members`` taking ``c * z + r`` seconds.

    ``c = 2 max_i sum_{j != i} 1 / (n beta_ij)``, ``r = 2 max rho_ij``; None if a pair has no link.
    """
    n = len(members)
    if n < 2:
        return 0.0, 0.0
    worst, rtt = 0.0, 0.0
    for i in members:
        t = 0.0
        for j in members:
            if i != j:
                ln = link(i, j)
                if ln is None:
                    return None
                t += 1.0 / ln.bytes_per_s
                rtt = max(rtt, ln.rtt_s)
        worst = max(worst, t)
    return 2.0 * worst / n, 2.0 * rtt


class CostModel:
    """The cost model bound to one scenario, with its per-layer sums precomputed."""

    def __init__(self, scenario: Scenario) -> None:
        self.sc = scenario
        job, model = scenario.job, scenario.model
        prof = model.profile
        self.n_layers = len(prof)
        self.m = float(job.micro_batch * model.seq_len)
        self.M = job.micro_batches
        self.H = job.sync_every
        self.d = model.dtype_bytes
        self.act_ratio = compression_ratio(job.activation_codec, self.d)
        # pseudo-gradients are fp32: between leaders (and forwarded home) with the sync codec, from members
        # to their leader with the intra codec
        self.sync_bytes_per_elem = encoded_bytes_per_element(job.sync_codec, 4)
        self.intra_bytes_per_elem = encoded_bytes_per_element(job.sync_intra_codec, 4)
        self.checkpointing = model.activation_checkpointing
        # recomputing activations in backward costs one more forward: a third of forward + backward
        recompute = RECOMPUTE_FLOPS_FACTOR if self.checkpointing else 1.0
        self.flops = [0.0]
        self.params = [0.0]
        self.saved = [0.0]  # activation bytes per token kept for backward per microbatch in flight, prefix sums
        # with checkpointing, one layer's full activations live at a time on top (one microbatch)
        self.working = 0.0
        for i, lp in enumerate(prof):
            self.flops.append(self.flops[-1] + lp.flops_per_token * recompute)
            self.params.append(self.params[-1] + lp.param_bytes)
            inp = prof[i - 1].activation_bytes_per_token if i > 0 else 0
            self.saved.append(self.saved[-1] + (inp if self.checkpointing else ACTIVATION_SAVE_FACTOR * inp))
            self.working = max(self.working, ACTIVATION_SAVE_FACTOR * inp if self.checkpointing else 0.0)
        self.act = [lp.activation_bytes_per_token for lp in prof]
        self.tied = float(model.tied_param_bytes)
        self.region_of = {p.id: p.region for p in scenario.peers}
        self.flops_of = {p.id: p.flops for p in scenario.peers}
        self.price_of = {p.id: p.usd_per_hour for p in scenario.peers}
        self._leader_cache: dict[tuple[str, ...], tuple[float, float] | None] = {}
        self.path_cache: dict[tuple[str, ...], list[str]] = {}  # the search's region paths, by region set

    # -- pieces used by the search -----------------------------------------------------------
    def stage_memory(self, start: int, end: int, stage: int, stages: int) -> float:
        """Bytes a peer needs to train layers ``[start, end)`` as stage ``stage`` of ``stages``."""
        n_params = (self.params[end] - self.params[start]) / self.d
        in_flight = min(self.M, stages - stage)
        saved = in_flight * self.m * (self.saved[end] - self.saved[start]) + self.m * self.working
        return n_params * (2 * self.d + OPTIMIZER_STATE_BYTES_PER_PARAM) + saved

    def stage_compute_s(self, start: int, end: int, flops: float) -> float:
        return self.m * (self.flops[end] - self.flops[start]) / flops

    def hop_bytes(self, boundary: int) -> float:
        """Raw bytes one way per microbatch across a hop after layer ``boundary - 1`` (before any codec)."""
        return self.m * self.act[boundary - 1]

    def hop_ratio(self, a: str, b: str) -> float:
        """The activation codec's ratio on the hop ``a -> b``: the job's codec across regions, none inside one.

        This is the coordinator's policy (``geotrain.coordinator.planning.hop_codecs``): fast links
        inside a region are not worth the codec's error.
        """
        return 1.0 if self.region_of[a] == self.region_of[b] else self.act_ratio

    # -- the whole prediction ------------------------------------------------------------------
    def check(self, pipelines: Sequence[Sequence[StageAssignment]], *, check_memory: bool = True) -> str | None:
        """Why ``pipelines`` is not a valid plan, or None when it is."""
        if not pipelines:
            return "a plan needs at least one pipeline"
        seen: set[str] = set()
        for pi, pipe in enumerate(pipelines):
            if not pipe:
                return f"pipeline {pi} has no stages"
            pos = 0
            for si, st in enumerate(pipe):
                if st.peer not in self.sc._peer:
                    return f"pipeline {pi} stage {si}: unknown peer {st.peer!r}"
                if st.peer in seen:
                    return f"peer {st.peer!r} appears twice; a peer runs one stage"
                seen.add(st.peer)
                a, b = st.layers
                if a != pos or b <= a:
                    return f"pipeline {pi} stage {si}: layers {st.layers} must start at {pos} and be non-empty"
                pos = b
                if check_memory:
                    need = self.stage_memory(a, b, si, len(pipe))
                    have = self.sc.peer(st.peer).memory_bytes
                    if need > have:
                        return (f"peer {st.peer!r} has {have / 1e9:.1f} GB but layers {a}..{b - 1} as stage {si} "
                                f"need {need / 1e9:.1f} GB")
            if pos != self.n_layers:
                return f"pipeline {pi} covers layers 0..{pos - 1}, not all {self.n_layers}"
            for si in range(len(pipe) - 1):
                if self.sc.link(pipe[si].peer, pipe[si + 1].peer) is None:
                    return f"no link between {pipe[si].peer!r} and {pipe[si + 1].peer!r} (pipeline {pi})"
            if self.tied and len(pipe) > 1 and self.sc.link(pipe[0].peer, pipe[-1].peer) is None:
                return (f"tied embeddings: no link between first stage {pipe[0].peer!r} and last stage "
                        f"{pipe[-1].peer!r} (pipeline {pi})")
        return None

    def predict(
        self,
        pipelines: Sequence[Sequence[StageAssignment]],
        *,
        detail: bool = True,
        check_memory: bool = True,
        trusted: bool = False,
    ) -> Prediction | str:
        """The prediction for a plan, or a string saying why the plan is infeasible.

        ``trusted`` skips :meth:`check` for plans the search built itself (split DP already checked them).
        """
        why = None if trusted else self.check(pipelines, check_memory=check_memory)
        if why is not None:
            return why
        sc, m, M = self.sc, self.m, self.M
        region, flops = self.region_of, self.flops_of
        pair_bytes: dict[tuple[str, str], float] = {}  # per inner step, (sender region, receiver region)
        compute: dict[str, float] = {}
        T, bottleneck = 0.0, ""
        steps: list[float] = []
        for pipe in pipelines:
            fill, worst, what = 0.0, 0.0, ""
            last = len(pipe) - 1
            comp, hops = [], []  # per stage C, per hop busy + RTT
            for si, st in enumerate(pipe):
                a0, b0 = st.layers
                c = m * (self.flops[b0] - self.flops[a0]) / flops[st.peer]
                compute[st.peer] = c
                comp.append(c)
                if c > worst:
                    worst, what = c, f"compute on {st.peer}"
                if si < last:
                    nxt = pipe[si + 1].peer
                    ln = sc.link(st.peer, nxt)
                    assert ln is not None
                    back = sc.link(nxt, st.peer)
                    assert back is not None
                    a = m * self.act[b0 - 1] / self.hop_ratio(st.peer, nxt)
                    # activations go a -> b, their gradients b -> a (one link each way)
                    busy = a / ln.bytes_per_s + a / back.bytes_per_s
                    hops.append(busy + ln.rtt_s)
                    if busy > worst:
                        worst, what = busy, f"link {st.peer}->{nxt}"
                    ra, rb = region[st.peer], region[nxt]
                    pair_bytes[(ra, rb)] = pair_bytes.get((ra, rb), 0.0) + M * a
                    pair_bytes[(rb, ra)] = pair_bytes.get((rb, ra), 0.0) + M * a
            fill = sum(comp) + sum(hops)
            if self.tied and last > 0:
                # tied embeddings: first and last stage swap and sum their gradients after the schedule
                a_peer, z_peer = pipe[0].peer, pipe[-1].peer
                ln = sc.link(a_peer, z_peer)
                assert ln is not None
                fill += 2.0 * self.tied / ln.bytes_per_s + ln.rtt_s
                ra, rb = region[a_peer], region[z_peer]
                for key in ((ra, rb), (rb, ra)):
                    pair_bytes[key] = pair_bytes.get(key, 0.0) + self.tied
            if hops and M > 1:
                # latency windows: stages s..e hold e - s + 1 microbatches (at most M) in the loop between them
                for s0 in range(len(comp) - 1):
                    loop = comp[s0]
                    for e in range(s0 + 1, len(comp)):
                        loop += hops[e - 1] + comp[e]
                        w = loop / min(M, e - s0 + 1)
                        if w > worst:
                            worst, what = w, f"round trip {pipe[s0].peer}..{pipe[e].peer}"
            t_p = fill + (M - 1) * worst
            steps.append(t_p)
            if t_p > T:
                T, bottleneck = t_p, what
        # -- rounds: stage groups are the peers holding the same layer segment in every pipeline
        Y = 0.0
        sync_bytes: dict[tuple[str, str], float] = {}  # per round
        if len(pipelines) > 1:
            groups: dict[tuple[str, ...], float] = {}
            first = [st.layers for st in pipelines[0]]
            if all(len(pipe) == len(first) and all(st.layers == lr for st, lr in zip(pipe, first, strict=True))
                   for pipe in pipelines):
                # one split for all pipelines: the stage groups are the grid's columns
                for si, (a, b) in enumerate(first):
                    groups[tuple(pipe[si].peer for pipe in pipelines)] = (self.params[b] - self.params[a]) / self.d
            else:
                cuts = sorted({st.layers[1] for pipe in pipelines for st in pipe} | {0})
                for a, b in itertools.pairwise(cuts):
                    holders = tuple(next(st.peer for st in pipe if st.layers[0] <= a < st.layers[1])
                                    for pipe in pipelines)
                    groups[holders] = groups.get(holders, 0.0) + (self.params[b] - self.params[a]) / self.d
            if self.tied:
                self._dedupe_tied(pipelines, groups)
            for members, n_params in groups.items():
                y = self._group_sync(members, n_params, sync_bytes)
                if y is None:
                    return f"stage group {list(members)} spans regions with no link between them"
                Y = max(Y, y)
        exposed = max(0.0, Y - sc.job.hidden_steps * T)
        t_eff = T + exposed / self.H
        if exposed > 0:
            bottleneck += f" + {exposed:.3g} s of round sync not hidden"
        for key, v in sync_bytes.items():
            pair_bytes[key] = pair_bytes.get(key, 0.0) + v / self.H
        usd_step = sum(v * sc.egress_usd_per_gb(ra, rb) for (ra, rb), v in pair_bytes.items()) / 1e9
        tokens_per_s = len(pipelines) * M * m / t_eff
        usd_per_hour = sum(self.price_of[q] for q in compute) + usd_step * 3600.0 / t_eff
        usd_per_mtok = usd_per_hour / (tokens_per_s * 3600.0) * 1e6 if tokens_per_s > 0 else math.inf
        cross = sum(v for (ra, rb), v in pair_bytes.items() if ra != rb)
        return Prediction(
            tokens_per_s=tokens_per_s,
            usd_per_hour=usd_per_hour,
            usd_per_mtok=usd_per_mtok,
            step_s=t_eff,
            cross_region_bytes_per_step=cross,
            bytes_per_region_pair=pair_bytes if detail else {},
            utilisation={q: M * c / t_eff for q, c in compute.items()} if detail else {},
            pipeline_step_s=T,
            round_sync_s=Y,
            exposed_sync_s=exposed,
            bottleneck=bottleneck,
            pipeline_steps_s=tuple(steps),
        )

    def _dedupe_tied(self, pipelines: Sequence[Sequence[StageAssignment]], groups: dict[tuple[str, ...], float]) -> None:
        """Count tied weights once in the group whose peers hold both ends of the model.

        The profile lists the tied weight in the first and in the last layer. A stage holding both keeps
        one shared tensor, so its pseudo-gradient carries it once; counting it twice made a 1-stage
        run's round bytes ~10% high (docs/scaling.md). Stages holding one end each sync their copy.
        """
        def holders(layer: int) -> tuple[str, ...]:
            return tuple(next(st.peer for st in pipe if st.layers[0] <= layer < st.layers[1]) for pipe in pipelines)

        first = holders(0)
        if first == holders(self.n_layers - 1) and first in groups:
            groups[first] -= self.tied / self.d

    def _intra_with_overrides(self, qs: Sequence[str], region_ln: Link) -> tuple[float, float]:
        """:func:`_butterfly_coeff` for one region's members: the region link plus each peer's overrides.

        O(n x overrides) instead of O(n^2) link lookups.
        """
        n = len(qs)
        members = set(qs)
        base = (n - 1) / region_ln.bytes_per_s
        worst, rtt = 0.0, region_ln.rtt_s
        for i in qs:
            t = base
            for j, ln in self.sc.peer_overrides(i).items():
                if j in members:
                    t += 1.0 / ln.bytes_per_s - 1.0 / region_ln.bytes_per_s
                    rtt = max(rtt, ln.rtt_s)
            worst = max(worst, t)
        return 2.0 * worst / n, 2.0 * rtt

    def _group_sync(self, members: Sequence[str], n_params: float, sent: dict[tuple[str, str], float]) -> float | None:
        """Seconds of one hierarchical all-reduce of ``n_params`` fp32 elements; adds bytes per region pair to ``sent``.

        Reduce inside each region (intra codec), butterfly all-reduce between
        one leader per region (sync codec), gather inside each region (the
        leaders forward the sync codec's encoding as is). Each leg is priced
        with its own codec: pricing the intra reduce with the cross-region
        codec made a 1-stage run's bytes 42% low (docs/scaling.md).
        """
        z = n_params * self.sync_bytes_per_elem
        z_up = n_params * self.intra_bytes_per_elem  # member -> leader
        sc, region = self.sc, self.region_of
        by_region: dict[str, list[str]] = {}
        for q in members:
            by_region.setdefault(region[q], []).append(q)
        intra = 0.0
        for r, qs in by_region.items():
            n = len(qs)
            if n < 2:
                continue
            ln = sc.region_link(r, r)
            coeff: tuple[float, float] | None
            if sc.has_peer_links and ln is not None:
                coeff = self._intra_with_overrides(qs, ln)
            elif sc.has_peer_links:
                coeff = _butterfly_coeff(qs, sc.link)
            else:
                # uniform links inside a region: the closed form, O(1) instead of O(n^2)
                coeff = None if ln is None else (2.0 * (n - 1) / n / ln.bytes_per_s, 2.0 * ln.rtt_s)
            if coeff is None:
                return None
            # coeff[0] prices a reduce and a gather of the same size: half of it per leg
            intra = max(intra, coeff[0] * (z_up + z) / 2.0 + coeff[1])
            sent[(r, r)] = sent.get((r, r), 0.0) + (n - 1) * (z_up + z)
        k = len(by_region)
        if k < 2:
            return intra
        if sc.has_peer_links:
            coeff = _butterfly_coeff([qs[0] for qs in by_region.values()], sc.link)
        else:
            key = tuple(sorted(by_region))
            if key not in self._leader_cache:
                self._leader_cache[key] = _butterfly_coeff(key, sc.region_link)
            coeff = self._leader_cache[key]
        if coeff is None:
            return None
        for ra in by_region:
            for rb in by_region:
                if ra != rb:
                    sent[(ra, rb)] = sent.get((ra, rb), 0.0) + 2.0 * z / k
        return intra + coeff[0] * z + coeff[1]


def evaluate(
    scenario: Scenario, pipelines: Sequence[Sequence[StageAssignment]], *, check_memory: bool = True
) -> Prediction:
    """Predict tokens/s, price and traffic of ``pipelines`` on ``scenario``.

    Raises :class:`InfeasiblePlanError` naming the problem when the plan is
    invalid (layers not covered once per pipeline, a peer used twice, a
    missing link, or — unless ``check_memory`` is False — a stage that does not
    fit its peer's memory).
    """
    res = CostModel(scenario).predict(pipelines, check_memory=check_memory)
    if isinstance(res, str):
        raise InfeasiblePlanError(res)
    return res
