"""From a live swarm to a plan: DHT records -> planner scenario -> :class:`~geotrain.plan.JobPlan`.

The coordinator plans exactly as ``geotrain plan`` does: it writes the same
scenario dict (regions, measured links, measured peers, the model's real
per-layer profile, the job) and calls :func:`geotrain.planner.plan`.

Links: each measured direction becomes a peer-to-peer link of its own (a pair
measured one way only: that figure for both ways). Each ordered region pair
also gets a link from the median of its measured directions, so a pair that was
not probed (peers probe only some: ``geotrain.swarm.probe_targets``) still has a
figure. Two regions nobody measured a pair between (the only pair's probe
failed, e.g. refused while a closed swarm's allow-lists had not caught up) are
priced through a third region both were measured to: the slower leg's bandwidth
and the sum of the RTTs, the best such path (:func:`bridged_region_links`; a
two-hop path bounds the direct one, so the estimate errs slow). Regions with no
path at all stay without a link, and the planner will not place a hop there.
"""

from __future__ import annotations

import itertools
import logging
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from geotrain.config import JobSpec
from geotrain.errors import InfeasiblePlanError
from geotrain.plan import JobPlan, StageSlot
from geotrain.swarm.records import LinkMeasurement, LinkRow, PeerRecord

logger = logging.getLogger(__name__)

DEFAULT_EGRESS_USD_PER_GB = 0.02


def egress_price(prices: Mapping[str, float], region: str) -> float:
    """USD per GB leaving ``region``: its own price, else the ``"*"`` entry, else the default."""
    return prices.get(region, prices.get("*", DEFAULT_EGRESS_USD_PER_GB))


def scenario_dict(
    job: JobSpec,
    peers: Mapping[str, PeerRecord],
    links: Mapping[str, LinkRow],
    *,
    egress_usd_per_gb: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The planner scenario for ``job`` on the live ``peers`` with their measured ``links``."""
    prices = dict(egress_usd_per_gb or {})
    regions = {p.region: {"egress_usd_per_gb": egress_price(prices, p.region)} for p in peers.values()}

    # each measured direction src -> dst (the prober's bulk transfer goes src -> dst): (bandwidth B/s, rtt s).
    # A pair measured both ways gets one link per direction (a home uplink is not its downlink); measured one
    # way, that figure stands for both.
    from geotrain.peers.reachability import measured_directions, relayed_links

    seen: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for src, dst, figure in measured_directions(peers, links):
        seen.setdefault((src, dst), []).append(figure)

    for key, relayed in relayed_links(peers, links).items():  # two peers behind NAT: an extra hop via a relay
        if key not in seen and key[::-1] not in seen:
            seen[key] = [relayed]
    link_list: list[dict[str, Any]] = []
    by_region_pair: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for (a, b), ms in sorted(seen.items()):
        bw = min(x[0] for x in ms)
        rtt = max(x[1] for x in ms)
        link_list.append({"a": a, "b": b, "bandwidth_gbps": bw * 8 / 1e9, "rtt_ms": rtt * 1e3})
        ra, rb = peers[a].region, peers[b].region
        by_region_pair.setdefault((ra, rb), []).append((bw, rtt))
    region_figures = {pair: (statistics.median(x[0] for x in ms), statistics.median(x[1] for x in ms))
                      for pair, ms in sorted(by_region_pair.items())}
    bridged = bridged_region_links(region_figures, regions)
    for (ra, rb), (bw, rtt) in bridged.items():
        logger.info("regions %s and %s: no pair measured; priced through a third region (%.1f Mbit/s, %.0f ms)",
                    ra, rb, bw * 8 / 1e6, rtt * 1e3)
    for (ra, rb), (bw, rtt) in [*region_figures.items(), *bridged.items()]:
        link_list.append({"a": ra, "b": rb, "bandwidth_gbps": bw * 8 / 1e9, "rtt_ms": rtt * 1e3})

    peer_list = [
        {
            "id": p.peer_id,
            "region": p.region,
            # measured in the job's dtype where the peer measured it (older peers: fp32 only)
            "tflops": max(p.flops_bf16 if job.model.dtype == "bf16" and p.flops_bf16 else p.flops, 1.0) / 1e12,
            "memory_gb": max(p.memory_bytes, 1) / 1e9,
            "usd_per_hour": p.usd_per_hour,
        }
        for p in sorted(peers.values(), key=lambda r: r.peer_id)
    ]
    return {"regions": regions, "links": link_list, "peers": peer_list, **job_scenario(job)}


def bridged_region_links(
    figures: Mapping[tuple[str, str], tuple[float, float]], regions: Iterable[str]
) -> dict[tuple[str, str], tuple[float, float]]:
    """(bytes/s, RTT s) for each pair of distinct ``regions`` without a figure in ``figures`` (either order),
    through the third region that gives the fastest two-leg path: the slower leg's bandwidth, the sum of the
    RTTs. Pairs priced so may price further pairs (in sorted order, until nothing changes); a pair with no
    path is left out."""
    known: dict[tuple[str, str], tuple[float, float]] = {}
    for (a, b), f in figures.items():
        known[(a, b)] = f
        known.setdefault((b, a), f)
    names = sorted(set(regions))
    out: dict[tuple[str, str], tuple[float, float]] = {}
    changed = True
    while changed:
        changed = False
        for a, b in itertools.combinations(names, 2):
            if (a, b) in known:
                continue
            paths = [(min(known[(a, c)][0], known[(c, b)][0]), known[(a, c)][1] + known[(c, b)][1])
                     for c in names if c not in (a, b) and (a, c) in known and (c, b) in known]
            if paths:
                best = max(paths, key=lambda f: (f[0], -f[1]))
                known[(a, b)] = known[(b, a)] = out[(a, b)] = best
                changed = True
    return out


def job_scenario(job: JobSpec) -> dict[str, Any]:
    """The ``model`` and ``job`` parts of a planner scenario for ``job`` (its real per-layer profile on the
    meta device, its dtype, its pipeline and sync settings); ``geotrain check --scenario`` plans with them too."""
    import torch

    from geotrain.models.profile import layer_profile

    model = job.model.block_model(job.job.seed, device="meta")
    sample = torch.zeros(1, job.model.context, dtype=torch.long)
    profile = [
        {
            "flops_per_token": lp.flops_per_token,
            "param_bytes": lp.param_bytes,
            "activation_bytes_per_token": lp.activation_bytes_per_token,
        }
        for lp in layer_profile(model, sample_input=sample, seed=job.job.seed)
    ]
    pipe = job.pipeline
    return {
        "model": {"profile": profile, "seq_len": job.model.context, "dtype_bytes": 2 if job.model.dtype == "bf16" else 4,
                  "tied_param_bytes": _tied_param_bytes(job),
                  # the memory model keeps only each layer's input when layers are recomputed in backward
                  "activation_checkpointing": job.model.activation_checkpointing},
        "job": {
            "micro_batch": pipe.micro_batch_size,
            "micro_batches": pipe.microbatches,
            "sync_every": job.sync.every,
            "stages": None if pipe.stages == "auto" else pipe.stages,
            "pipelines": None if pipe.pipelines == "auto" else pipe.pipelines,
            "activation_codec": job.codecs.activation,
            "sync_codec": job.sync.codec,
            "sync_intra_codec": job.sync.intra_codec,  # members -> their region's leader
            "overlap_sync": job.sync.overlap > 0,  # a blocking round (overlap 0) is not hidden behind compute
            "overlap_steps": job.sync.overlap,  # ... and an overlapping one only behind tau inner steps
            "objective": job.objective.planner_objective(),
        },
    }


def _tied_param_bytes(job: JobSpec) -> int:
    """Bytes of weights tied across the first and last stage (their gradients are swapped every step)."""
    if job.model.loader is not None:
        return 0  # a user model's tied groups are not sized here; the planner leaves that traffic out
    if job.model.is_hf:
        model = job.model.block_model(job.job.seed, device="meta")
        total = 0
        for group in model.tied_groups:
            block, name = group.members[0]
            p = dict(model.build_block(block, job.job.seed).named_parameters()).get(name)
            total += p.numel() * 4 if p is not None else 0  # fp32 gradients are swapped
        return total
    cfg = job.model.gpt_config()
    return int(cfg.vocab_size * cfg.d_model * 4) if cfg.tie_embeddings else 0


def with_passive(links: Mapping[str, LinkRow], passive: Mapping[tuple[str, str], tuple[float, float]]
                 ) -> dict[str, LinkRow]:
    """``links`` with each passive figure, ``(src, dst) -> (bytes/s, measured_at)`` from the job's own traffic,
    in place of what probes said for that direction, unless a probe measured it later. Its RTT is the probed
    one of either direction (real traffic measures none); a pair no probe ever measured is left as it was."""
    out = dict(links)
    for (src, dst), (bps, at) in passive.items():
        row = out.get(src)
        mine = row.links.get(dst) if row else None
        probed = mine or (out[dst].links.get(src) if dst in out else None)
        if probed is None or (mine is not None and mine.measured_at > at):
            continue
        fig = LinkMeasurement(bandwidth_bps=bps, rtt_s=probed.rtt_s, measured_at=at)
        out[src] = LinkRow(src=src, links={**(row.links if row else {}), dst: fig})
    return out


def hop_codecs(job: JobSpec, pipeline: list[StageSlot]) -> tuple[tuple[str, str], ...]:
    """Codec per hop: lossless inside a region (fast links), the job's codecs across regions."""
    out = []
    for a, b in zip(pipeline, pipeline[1:], strict=False):
        if a.region and a.region == b.region:
            out.append(("none", "none"))
        else:
            out.append((job.codecs.activation, job.codecs.activation_grad))
    return tuple(out)


def make_plan(
    job: JobSpec,
    job_id: str,
    *,
    version: int,
    peers: Mapping[str, PeerRecord],
    links: Mapping[str, LinkRow],
    start_step: int = 0,
    state_step: int | None = None,
    stop_step: int | None = None,
    resume_step: int | None = None,
    egress_usd_per_gb: Mapping[str, float] | None = None,
) -> tuple[JobPlan, dict[str, Any]]:
    """Plan ``job`` on the live swarm; returns the plan and the planner's JSON (with baselines)."""
    from geotrain.peers.reachability import plannable_peers
    from geotrain.planner import plan as run_planner
    from geotrain.planner.scenario import Scenario

    peers = plannable_peers(peers)  # nobody is placed where others must dial it and cannot
    if not peers:
        raise InfeasiblePlanError("no live peer to plan on: none reports progress for this job, or none can be "
                                  "dialled")
    scenario = Scenario.from_dict(scenario_dict(job, peers, links, egress_usd_per_gb=egress_usd_per_gb))
    result = run_planner(scenario, seed=job.job.seed, time_budget_s=10.0)
    pipelines = []
    for pipe in result.pipelines:
        slots = [
            StageSlot(
                peer=a.peer,
                start=a.layers[0],
                end=a.layers[1],
                endpoint=peers[a.peer].endpoint,
                region=peers[a.peer].region,
                curve_public_key=peers[a.peer].curve_public_key,
            )
            for a in pipe
        ]
        pipelines.append(slots)
    from geotrain.peers.reachability import assign_relay, relay_candidate

    # two peers behind NAT reach each other through a reachable one (the one their links were priced through)
    pipelines = assign_relay(pipelines, prefer=relay_candidate(peers, links))
    pred = result.predicted
    # what the plan assumed for each hop, both ways (bytes/s): the coordinator holds real traffic against it
    hops: list[list[Any]] = []
    for slots in pipelines:
        for a, b in zip(slots, slots[1:], strict=False):
            for src, dst in ((a.peer, b.peer), (b.peer, a.peer)):
                ln = scenario.link(src, dst)
                if ln is not None:
                    hops.append([src, dst, ln.bandwidth_gbps * 1e9 / 8])
    plan = JobPlan(
        job_id=job_id,
        version=version,
        pipelines=tuple(tuple(p) for p in pipelines),
        spares=tuple(result.spares),
        activation_codec=job.codecs.activation,
        activation_grad_codec=job.codecs.activation_grad,
        sync_codec=job.sync.codec,
        intra_codec=job.sync.intra_codec,
        hop_codecs=tuple(hop_codecs(job, p) for p in pipelines),
        start_step=start_step,
        state_step=state_step,
        stop_step=stop_step,
        checkpoint_dir=job.checkpoint.dir,
        checkpoint_every=job.sync.every * job.checkpoint.every_rounds if job.checkpoint.dir else 0,
        resume_step=resume_step,
        num_blocks=len(scenario.model.profile),
        predicted={
            "tokens_per_s": pred.tokens_per_s,
            "usd_per_hour": pred.usd_per_hour,
            "usd_per_mtok": pred.usd_per_mtok,
            "step_s": pred.step_s,
            "cross_region_bytes_per_step": pred.cross_region_bytes_per_step,
        },
    )
    return plan, {**result.to_json(), "hop_bandwidth_bps": hops}
