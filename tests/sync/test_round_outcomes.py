"""Round outcomes are typed (RoundStatus); a leader that cannot encode discards the round, not its thread."""

from __future__ import annotations

import pytest
import torch

from geotrain.sync import RoundOutcome, RoundStatus
from geotrain.sync.membership import RoundId
from tests.sync.conftest import Group, exact_config, flat_params, seeded_model


def _shift(group: Group, scale: float, *, reset: bool = False) -> None:
    """Move every member's local weights by ``scale`` times a seeded draw (from the global copy if ``reset``)."""
    for i, peer in enumerate(group.peers):
        if reset:  # local := global, as a rebuilt worker would start
            for frag, outer in zip(peer.sync.fragments, peer.sync.outer, strict=True):
                frag.assign(outer.global_flat)
        g = torch.Generator().manual_seed(7 + i)
        with torch.no_grad():
            for p in peer.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * scale)


def test_a_leader_whose_encode_fails_discards_the_round_and_the_next_round_runs(group: Group) -> None:
    # two regions, so both members are leaders and shard owners; fp16 cannot carry values beyond 65504,
    # so a pseudo-gradient of ~1e6 makes each leader's cross-region encode raise a CodecError
    config = exact_config(cross_codec="fp16", deadline_floor_s=1.0)
    group.build(["eu", "us"], config, seeded_model())
    before = [p.sync.global_flat().clone() for p in group.peers]
    _shift(group, 1e6)
    outcomes = group.step_all(1)
    for peer, out, g0 in zip(group.peers, outcomes, before, strict=True):
        (o,) = out
        assert o.status is RoundStatus.DISCARDED and not o.committed, o
        assert torch.equal(peer.sync.global_flat(), g0)  # a discarded round changes nothing
    assert any("cannot encode" in o.reason for (o,) in outcomes), outcomes
    # the runners are still usable: the next round (small, encodable progress) commits everywhere
    _shift(group, 0.01, reset=True)
    locals_ = [flat_params(p.model) for p in group.peers]
    outcomes = group.step_all(2)
    for (o,) in outcomes:
        assert o.status is RoundStatus.COMMITTED and o.committed, o
    mean = torch.stack(locals_).mean(0)
    for peer in group.peers:
        # outer lr 1, no momentum: the new global copy is the members' mean (fp16 on the wire)
        assert torch.allclose(peer.sync.global_flat(), mean, atol=1e-2)
    assert all(p.sync.stats.rounds_discarded == 1 and p.sync.stats.rounds_committed == 1 for p in group.peers)


def test_a_quorum_loss_is_a_typed_discard_and_a_member_outside_the_round_is_aborted(group: Group) -> None:
    config = exact_config(quorum=1.0, deadline_floor_s=1.0)
    group.build(["eu", "us", "us"], config, seeded_model())
    _shift(group, 0.1)
    outcomes = group.step_all(1, peers=group.peers[:2])  # the third member never takes part
    assert all(o.status is RoundStatus.DISCARDED for (o,) in outcomes), outcomes
    assert any("quorum" in o.reason for (o,) in outcomes), outcomes
    runner = group.peers[0].sync.runner
    from geotrain.sync import StaticMembership

    runner.membership = StaticMembership([])  # a round this peer is not a member of
    out = runner.run(RoundId(0, 5), torch.zeros(runner.numels[0]))
    assert out.status is RoundStatus.ABORTED and not out.committed


def test_an_outcome_must_be_typed_and_only_a_committed_one_carries_a_delta() -> None:
    rid = RoundId(0, 0)
    with pytest.raises(TypeError):
        RoundOutcome(rid, False)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RoundOutcome(rid, RoundStatus.COMMITTED)
    with pytest.raises(ValueError):
        RoundOutcome(rid, RoundStatus.DISCARDED, torch.zeros(1))
    assert RoundOutcome(rid, RoundStatus.DISCARDED).definitive
    assert not RoundOutcome(rid, RoundStatus.UNKNOWN).definitive
