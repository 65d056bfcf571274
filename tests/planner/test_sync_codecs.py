"""Each leg of the hierarchical round is priced with its own codec, as the runtime sends it.

Members send their pseudo-gradient to their region's leader with ``sync_intra_codec`` (the runtime's
``sync.intra_codec``, default "none"); leaders exchange shards with ``sync_codec`` and forward that
encoding home as is. Pricing the intra leg with the cross-region codec made a 1-stage run's bytes
42% low (docs/scaling.md).
"""

from __future__ import annotations

import pytest

from geotrain.errors import ScenarioError
from geotrain.planner import Scenario, StageAssignment
from geotrain.planner.codecs import encoded_bytes_per_element
from geotrain.planner.costmodel import CostModel, Prediction
from tests.planner.helpers import link, peer, scenario

N_ELEMS = 4 * 1_000_000 / 2  # helpers' 4 layers of 1 MB of bf16 parameters -> fp32 pseudo-gradient elements
INT8 = encoded_bytes_per_element("int8", 4)  # 1 + 2/256 bytes per element


def _predict(**job: object) -> Prediction:
    """4 one-stage pipelines, 2 peers in each of 2 regions: one stage group with 2 members per region."""
    peers = [peer(f"p{i}", f"r{i % 2}") for i in range(4)]
    links = [link("r0", "r0", 10.0, 1.0), link("r1", "r1", 10.0, 1.0), link("r0", "r1", 1.0, 50.0)]
    sc = Scenario.from_dict(scenario(peers, links, sync_codec="int8", **job))
    pipes = [[StageAssignment(peer=f"p{i}", layers=(0, 4))] for i in range(4)]
    pred = CostModel(sc).predict(pipes)
    assert isinstance(pred, Prediction), pred
    return pred


def test_intra_leg_priced_with_the_intra_codec() -> None:
    default, plain, int8 = _predict(), _predict(sync_intra_codec="none"), _predict(sync_intra_codec="int8")
    assert default == plain  # the runtime's default: uncompressed inside a region
    for r in ("r0", "r1"):
        # one member per region sends its whole pseudo-gradient up; the leader forwards the int8 result down
        assert plain.bytes_per_region_pair[(r, r)] == pytest.approx(N_ELEMS * (4.0 + INT8))
        assert int8.bytes_per_region_pair[(r, r)] == pytest.approx(N_ELEMS * 2 * INT8)
        # so the difference is the codec's ratio on the member -> leader leg only
        diff = plain.bytes_per_region_pair[(r, r)] - int8.bytes_per_region_pair[(r, r)]
        assert diff == pytest.approx(N_ELEMS * INT8 * (4.0 / INT8 - 1.0))
    for pair in (("r0", "r1"), ("r1", "r0")):
        # between the 2 leaders: each sends its half shard and gets the other's result half, int8 both ways
        assert plain.bytes_per_region_pair[pair] == int8.bytes_per_region_pair[pair] == pytest.approx(N_ELEMS * INT8)
    assert plain.cross_region_bytes_per_step == int8.cross_region_bytes_per_step


def test_intra_leg_time_follows_its_bytes() -> None:
    plain, int8 = _predict(sync_intra_codec="none"), _predict(sync_intra_codec="int8")
    bps = 10e9 / 8
    # a pair's butterfly: (n - 1) / n of each leg's bytes over the region's link, plus 2 RTTs
    intra_plain = N_ELEMS * (4.0 + INT8) / 2 / bps + 2e-3
    intra_int8 = N_ELEMS * 2 * INT8 / 2 / bps + 2e-3
    assert plain.round_sync_s - int8.round_sync_s == pytest.approx(intra_plain - intra_int8, rel=1e-9)


def test_unknown_intra_codec_is_refused() -> None:
    peers = [peer("p0", "r0")]
    with pytest.raises(ScenarioError, match="sync_intra_codec"):
        Scenario.from_dict(scenario(peers, [link("r0", "r0", 10.0, 1.0)], sync_intra_codec="zip"))



def _r0_bytes(stages: int, tied: int) -> float:
    """Bytes per step inside r0 (H = 1) of 4 pipelines over 2 regions, with ``tied`` bytes tied first <-> last."""
    peers = [peer(f"p{i}", f"r{i % 2}") for i in range(4 * stages)]
    links = [link("r0", "r0", 10.0, 1.0), link("r1", "r1", 10.0, 1.0), link("r0", "r1", 1.0, 50.0)]
    d = scenario(peers, links, sync_codec="none")
    d["model"]["tied_param_bytes"] = tied
    cuts = [(0, 4)] if stages == 1 else [(0, 2), (2, 4)]
    # pipeline i: stage s on peer p{4 s + i}, all in region i % 2, so every stage group has 2 members per region
    pipes = [[StageAssignment(peer=f"p{4 * s + i}", layers=lr) for s, lr in enumerate(cuts)] for i in range(4)]
    pred = CostModel(Scenario.from_dict(d)).predict(pipes)
    assert isinstance(pred, Prediction), pred
    return pred.bytes_per_region_pair[("r0", "r0")]


def test_tied_weight_synced_once_when_one_stage_holds_both_ends() -> None:
    tied = 500_000  # bf16 bytes, listed in the first and in the last layer's parameters
    # one stage holds the shared tensor once: the round (1 member up, the leader down, fp32) carries it once
    assert _r0_bytes(1, 0) - _r0_bytes(1, tied) == pytest.approx(2 * 4.0 * tied / 2)
    # two stages: each end syncs its own copy in its own group; what tying adds is the gradient swap
    # between the ends, each way, of r0's 2 pipelines
    assert _r0_bytes(2, tied) - _r0_bytes(2, 0) == pytest.approx(2 * 2 * tied)
