"""Round math over real loopback transports: exact average, golden Nesterov, hierarchical == flat."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from geotrain.sync import DiLoCoConfig
from tests.sync.conftest import Group, exact_config, flat_params, seeded_model

REGIONS = ["eu", "eu", "us", "us"]


def _perturb(group: Group, scale: float = 0.1) -> list[torch.Tensor]:
    """Give each member different local weights; return them flattened."""
    out = []
    for i, peer in enumerate(group.peers):
        g = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for p in peer.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * scale)
        out.append(flat_params(peer.model))
    return out


def test_round_is_exact_average(group: Group) -> None:
    group.build(REGIONS, exact_config(), seeded_model())
    locals_ = _perturb(group)
    outcomes = group.step_all(1)
    expected = torch.stack(locals_).mean(0)
    for peer, out in zip(group.peers, outcomes, strict=True):
        assert len(out) == 1 and out[0].committed, out
        assert sorted(out[0].contributors) == ["p0", "p1", "p2", "p3"]
        torch.testing.assert_close(peer.sync.global_flat(), expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(flat_params(peer.model), expected, atol=1e-6, rtol=0)
    first = group.peers[0].sync.global_flat()
    assert all(torch.equal(p.sync.global_flat(), first) for p in group.peers)
    stats = [p.sync.stats for p in group.peers]
    assert sum(s.bytes_cross for s in stats) > 0 and sum(s.bytes_intra for s in stats) > 0


def _local_steps(model: nn.Module, member: int, rnd: int, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(steps):
        g = torch.Generator().manual_seed(1000 * member + 10 * rnd + s)
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def test_three_nesterov_rounds_match_single_process_reference(group: Group) -> None:
    h = 2
    config = DiLoCoConfig(every=h, intra_codec="none", cross_codec="none", error_feedback=False, deadline_floor_s=2.0)
    group.build(["eu", "eu", "us"], config, seeded_model())
    # reference: one global model, plain torch SGD(nesterov) as the outer optimizer
    ref = seeded_model()()
    outer = torch.optim.SGD(ref.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    for rnd in range(3):
        deltas = []
        for m in range(3):
            worker = seeded_model()()
            worker.load_state_dict(ref.state_dict())
            _local_steps(worker, m, rnd, h)
            deltas.append([pg.detach() - pw.detach() for pg, pw in zip(ref.parameters(), worker.parameters(), strict=True)])
        outer.zero_grad()
        for i, p in enumerate(ref.parameters()):
            p.grad = torch.stack([d[i] for d in deltas]).mean(0)
        outer.step()
        # the group: each member trains from its local weights (== global after each commit)
        for m, peer in enumerate(group.peers):
            _local_steps(peer.model, m, rnd, h)
        outcomes = group.step_all((rnd + 1) * h)
        assert all(o[0].committed for o in outcomes)
    expected = flat_params(ref)
    for peer in group.peers:
        torch.testing.assert_close(peer.sync.global_flat(), expected, atol=1e-6, rtol=0)
        assert torch.equal(peer.sync.global_flat(), group.peers[0].sync.global_flat())
        assert torch.equal(peer.sync.outer[0].momentum, group.peers[0].sync.outer[0].momentum)  # type: ignore[arg-type]


def _run_once(group: Group, config: DiLoCoConfig) -> tuple[torch.Tensor, list[torch.Tensor]]:
    group.build(REGIONS, config, seeded_model())
    locals_ = _perturb(group)
    group.step_all(1)
    out = group.peers[0].sync.global_flat()
    assert all(torch.equal(p.sync.global_flat(), out) for p in group.peers)
    return out, locals_


def test_hierarchical_equals_flat_without_compression() -> None:
    results = []
    for hierarchical in (True, False):
        g = Group()
        try:
            results.append(_run_once(g, exact_config(hierarchical=hierarchical))[0])
        finally:
            g.close()
    torch.testing.assert_close(results[0], results[1], atol=1e-6, rtol=0)


def test_hierarchical_int8_within_codec_bound() -> None:
    g = Group()
    try:
        out, locals_ = _run_once(g, exact_config(cross_codec="int8"))
        g0 = flat_params(seeded_model()())
    finally:
        g.close()
    exact = torch.stack(locals_).mean(0)
    pgs = [g0 - x for x in locals_]
    # int8 error <= max|block| / 254 per encode: a region sum (n=2) once on the way out, the mean once back
    bound = (2 * max(float(p.abs().max()) for p in pgs) * 2 / 4 + max(float(p.abs().max()) for p in pgs)) / 254
    err = float((out - exact).abs().max())
    assert 0 < err <= bound, (err, bound)


def test_state_dict_round_trips_through_torch_save(group: Group, tmp_path: Path) -> None:
    config = DiLoCoConfig(every=1, cross_codec="int8", deadline_floor_s=2.0, fragments=1)
    group.build(["eu", "us"], config, seeded_model())
    _perturb(group)
    group.step_all(1)
    path = tmp_path / "sync.pt"
    torch.save(group.peers[0].sync.state_dict(), path)
    state = torch.load(path, weights_only=True)
    joiner_model = seeded_model(seed=5)()
    from geotrain.sync import DiLoCoSync, Member, StaticMembership
    from geotrain.transport import Transport, TransportConfig

    with Transport(TransportConfig(), peer_id="joiner", region="eu").start() as t:
        joiner = DiLoCoSync(config, params=list(joiner_model.named_parameters()), transport=t,
                            membership=StaticMembership([Member("joiner", "eu", t.address)]))
        joiner.load_state_dict(state)
        assert torch.equal(joiner.global_flat(), group.peers[0].sync.global_flat())
        assert torch.equal(joiner.outer[0].momentum, group.peers[0].sync.outer[0].momentum)  # type: ignore[arg-type]
        assert joiner.outer[0].version == 1
        assert torch.equal(flat_params(joiner_model), joiner.global_flat())
