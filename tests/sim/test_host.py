"""``geotrain.sim.host``: peers that share a machine's cores step no faster than their CPU work over those cores,
and ``benchmarks.simval.nnls``, the fit of its terms."""

from __future__ import annotations

import pytest

from benchmarks.simval import nnls
from geotrain.errors import ConfigError
from geotrain.planner import CostModel, Scenario, StageAssignment
from geotrain.sim import HostModel, SimConfig, peer_cpu_terms, simulate
from tests.planner.helpers import link, peer, scenario


def _sc(**job) -> Scenario:
    peers = [peer(f"p{i}", "r", tflops=1.0) for i in range(4)]
    return Scenario.from_dict(scenario(peers, [link("r", "r", 10.0, 1.0)], micro_batches=4, sync_every=10, **job))


def test_cpu_terms_count_flops_messages_and_synced_params() -> None:
    sc = _sc()
    cm = CostModel(sc)
    pipe = [StageAssignment("p0", (0, 1)), StageAssignment("p1", (1, 3)), StageAssignment("p2", (3, 4))]
    ends, middle = peer_cpu_terms(cm, pipe, 0), peer_cpu_terms(cm, pipe, 1)
    # TFLOPs per step: the stage's compute seconds at 1 TFLOP/s, M microbatches
    assert ends[0] == pytest.approx(cm.M * cm.stage_compute_s(0, 1, 1e12))
    assert middle[0] == pytest.approx(2 * ends[0])
    # M activations and M gradients per neighbour, each sent or received once
    assert (ends[1], ends[2], middle[2]) == (1.0, 2 * 4, 4 * 4)
    params = (cm.params[1] - cm.params[0]) / cm.d
    assert ends[3] == pytest.approx(params / 1e6 / 10)


def test_floor_is_the_hosts_cpu_over_its_free_cores() -> None:
    sc = _sc()
    cm = CostModel(sc)
    pipes = [[StageAssignment("p0", (0, 4))], [StageAssignment("p1", (0, 4))], [StageAssignment("p2", (0, 4))]]
    host = HostModel(cores=2.0, reserved_cores=0.5, host_of={"p0": "a", "p1": "a"}, cpu_tflops=0.5,
                     step_cpu_s=0.01, round_cpu_s_per_mparam=0.2)
    per_peer = [host.peer_cpu_s(peer_cpu_terms(cm, p, 0)) for p in pipes[:2]]
    t = peer_cpu_terms(cm, pipes[0], 0)
    assert per_peer[0] == pytest.approx(t[0] / 0.5 + 0.01 + 0.2 * t[3])
    # p0 and p1 share host a (1.5 free cores); p2 has a machine of its own
    assert host.floors(cm, pipes) == pytest.approx([sum(per_peer) / 1.5] * 2 + [0.0])


def test_simulated_step_is_the_floor_when_the_host_is_the_bottleneck() -> None:
    sc = _sc(overlap_sync=True)
    pipes = [[StageAssignment(f"p{i}", (0, 4))] for i in range(4)]
    cfg = dict(hours=0.2, straggler_sigma=0.0, exact_pipelines=False)
    free = simulate(sc, SimConfig(**cfg), initial_plan=pipes)
    step = CostModel(sc).predict(pipes).step_s
    assert free.summary()["goodput_tokens_per_s"] == pytest.approx(4 * 4 * 100 / step, rel=1e-6)
    host = HostModel(cores=1.0, host_of={f"p{i}": "box" for i in range(4)}, step_cpu_s=step)  # 4 x step on 1 core
    boxed = simulate(sc, SimConfig(**cfg, host=host), initial_plan=pipes)
    assert boxed.summary()["goodput_tokens_per_s"] == pytest.approx(4 * 4 * 100 / (4 * step), rel=1e-6)


@pytest.mark.parametrize("kw, match", [({"cores": 0}, "cores"), ({"cores": 2, "reserved_cores": 2}, "reserved"),
                                       ({"cores": 2, "message_cpu_s": -1}, "message_cpu_s")])
def test_bad_host_model_is_refused(kw, match) -> None:
    with pytest.raises(ConfigError, match=match):
        HostModel(**kw)


def test_nnls_recovers_terms_and_clamps_negative_ones() -> None:
    rows = [(x, 1.0, m, r) for x in (0.1, 0.2, 0.4) for m in (0.0, 8.0) for r in (0.01, 0.03)]
    truth = (2.0, 0.01, 0.001, 0.5)
    coef, rss = nnls(rows, [sum(c * v for c, v in zip(truth, row, strict=True)) for row in rows])
    assert coef == pytest.approx(truth) and rss == pytest.approx(0.0, abs=1e-20)
    # a negative message term is not physical: it is dropped and the rest refitted
    coef, _ = nnls(rows, [2.0 * row[0] + 0.05 - 0.001 * row[2] for row in rows])
    assert coef[2] == 0.0 and all(c >= 0 for c in coef)
