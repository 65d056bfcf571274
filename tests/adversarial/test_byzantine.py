"""Item 25: one Byzantine member of five. Robust aggregation holds the loss; plain mean shows the damage.

Five members (two regions: 3 + 2) train the embedded tiny GPT with DiLoCo over
real transports on loopback. Member ``rep1`` is the attacker: at every round it
replaces its honest pseudo-gradient ``d`` (global - local) with

- ``sign_flip``: ``-4 d`` (cancels the four honest members in a plain mean),
- ``scale``: ``1000 d``,
- ``noise``: Gaussian noise with 100x the norm of ``d``,

by setting its own local weights (all a Byzantine peer controls). The norm
screen (``max_norm_ratio``) is switched off here, so the aggregator alone is
tested. Expected: with ``trimmed_mean`` and with ``centered_clip`` the final
validation loss is within 5% of the attack-free run's; with ``mean`` the same
attack costs far more than 5% (so the check can fail), and every member ends
with identical global weights either way.
"""

from __future__ import annotations

import concurrent.futures
import math
from typing import Any

import pytest
import torch

from benchmarks.sync import Setup, batch, build_model, val_loss
from geotrain.data import DataConfig, TokenDataset, build_dataset
from geotrain.sync import DiLoCoConfig, DiLoCoSync, Member, StaticMembership
from geotrain.sync.outer import split_fragments
from geotrain.transport import Transport, TransportConfig

SETUP = Setup(replicas=5, regions=2, steps=60, batch=8, val_batches=4, data_bytes=1 << 20)
ATTACKER = 1
ATTACKS = ("sign_flip", "scale", "noise")


@pytest.fixture(scope="module")
def data() -> TokenDataset:
    torch.set_num_threads(1)
    return build_dataset(DataConfig(max_bytes=SETUP.data_bytes))


def poisoned(kind: str, honest: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if kind == "sign_flip":
        return -4.0 * honest
    if kind == "scale":
        return 1000.0 * honest
    noise = torch.randn(honest.shape, generator=gen)
    return noise * (100.0 * float(honest.norm()) / float(noise.norm()))


def train(data: TokenDataset, aggregation: str, attack: str | None) -> dict[str, Any]:
    config = DiLoCoConfig(
        every=10, cross_codec="none", intra_codec="none", error_feedback=False, aggregation=aggregation,  # type: ignore[arg-type]
        max_norm_ratio=1e12, deadline_floor_s=20.0,
    )
    regions = ["r0", "r0", "r0", "r1", "r1"]
    transports = [Transport(TransportConfig(), peer_id=f"rep{i}", region=r).start() for i, r in enumerate(regions)]
    try:
        membership = StaticMembership([Member(t.peer_id, t.region, t.address) for t in transports])
        models = [build_model(SETUP) for _ in transports]
        syncs = [DiLoCoSync(config, params=list(m.named_parameters()), transport=t, membership=membership)
                 for m, t in zip(models, transports, strict=True)]

        def replica(i: int) -> None:
            opt = torch.optim.AdamW(models[i].parameters(), lr=SETUP.lr)
            gen = torch.Generator().manual_seed(99)
            for step in range(SETUP.steps):
                tokens = batch(SETUP, data, step, i)
                loss = models[i].loss(models[i](tokens[:, :-1]), tokens[:, 1:])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sync = syncs[i]
                if attack is not None and i == ATTACKER and sync.due(step + 1, 0) is not None:
                    g = sync.outer[0].global_flat
                    honest = g - sync.fragments[0].flat()  # (N,)
                    sync.fragments[0].assign(g - poisoned(attack, honest, gen))
                sync.after_inner_step(step + 1)

        with concurrent.futures.ThreadPoolExecutor(len(transports)) as pool:
            for f in [pool.submit(replica, i) for i in range(len(transports))]:
                f.result(timeout=300)
        history = syncs[0].history
        identical = all(torch.equal(s.global_flat(), syncs[0].global_flat()) for s in syncs)
        final = build_model(SETUP)
        (frag,) = split_fragments(list(final.named_parameters()), 1)
        frag.assign(syncs[0].outer[0].global_flat)
        for s in syncs:
            s.close()
    finally:
        for t in transports:
            t.close()
    return {
        "loss": val_loss(SETUP, data, final),
        "committed": sum(o.committed for o in history),
        "identical": identical,
    }


@pytest.fixture(scope="module")
def clean(data: TokenDataset) -> float:
    out = train(data, "mean", None)
    assert out["committed"] == SETUP.steps // 10 and out["identical"]
    return float(out["loss"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("aggregation", ["centered_clip", "trimmed_mean"])
@pytest.mark.parametrize("attack", ATTACKS)
def test_robust_aggregation_keeps_the_loss_within_5_percent(
    data: TokenDataset, clean: float, attack: str, aggregation: str
) -> None:
    r = train(data, aggregation, attack)
    assert r["committed"] == SETUP.steps // 10 and r["identical"], r
    assert r["loss"] <= 1.05 * clean, {"attacked": r["loss"], "clean": clean}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("attack", ATTACKS)
def test_plain_mean_shows_the_damage(data: TokenDataset, clean: float, attack: str) -> None:
    r = train(data, "mean", attack)
    assert r["committed"] == SETUP.steps // 10 and r["identical"], r  # the attack is not a crash: it is silent
    assert not math.isfinite(r["loss"]) or r["loss"] > 1.05 * clean, {"attacked": r["loss"], "clean": clean}
