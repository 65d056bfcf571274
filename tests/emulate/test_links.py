"""LinkEmulator: exact timings on an injected clock, and FIFO properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.emulate import LinkEmulator, LinkEmulatorConfig, LinkPath, topology_from_dict
from geotrain.errors import ConfigError, EmulationError

MB = 1_000_000


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(paths: dict[tuple[str, str], LinkPath], local: str = "eu") -> tuple[LinkEmulator, FakeClock]:
    clock = FakeClock()
    return LinkEmulator(LinkEmulatorConfig(local_region=local, paths=paths), clock=clock), clock


def test_one_message_is_serialization_plus_propagation() -> None:
    em, _ = make({("eu", "us"): LinkPath(delay_s=0.04, bandwidth_bps=10 * MB)})
    assert em.delay_for("us", 5 * MB) == pytest.approx(0.5 + 0.04)
    assert em.before_send("us", 5 * MB) == pytest.approx(0.54)


def test_messages_to_one_destination_queue_fifo() -> None:
    em, clock = make({("eu", "us"): LinkPath(delay_s=0.04, bandwidth_bps=10 * MB)})
    assert em.before_send("us", 1 * MB) == pytest.approx(0.1 + 0.04)
    assert em.before_send("us", 2 * MB) == pytest.approx(0.1 + 0.2 + 0.04)  # waits behind the first
    clock.t += 0.25  # link still busy until t0 + 0.3
    assert em.before_send("us", 1 * MB) == pytest.approx(0.05 + 0.1 + 0.04)
    clock.t += 10.0  # idle again: no queue left
    assert em.before_send("us", 1 * MB) == pytest.approx(0.14)
    # delay_for never reserves: asking twice gives the idle figure
    assert em.delay_for("us", 1 * MB) == em.delay_for("us", 1 * MB) == pytest.approx(0.14)
    assert em.stats() == {"us": {"bytes": 5 * MB, "messages": 4}}


def test_destinations_do_not_queue_behind_each_other() -> None:
    em, _ = make({
        ("eu", "us"): LinkPath(delay_s=0.04, bandwidth_bps=10 * MB),
        ("eu", "ap"): LinkPath(delay_s=0.1, bandwidth_bps=5 * MB),
    })  # fmt: skip
    assert em.before_send("us", 10 * MB) == pytest.approx(1.04)
    assert em.before_send("ap", 1 * MB) == pytest.approx(0.2 + 0.1)


def test_delay_only_paths_never_queue() -> None:
    em, _ = make({("eu", "us"): LinkPath(delay_s=0.075)})
    assert [em.before_send("us", 100 * MB) for _ in range(3)] == pytest.approx([0.075, 0.075, 0.075])


def test_local_region_defaults_to_no_delay_and_unknown_region_fails() -> None:
    em, _ = make({("eu", "us"): LinkPath(delay_s=0.01)})
    assert em.before_send("eu", 123) == 0.0
    with pytest.raises(EmulationError, match="eu -> mars"):
        em.before_send("mars", 1)
    with pytest.raises(EmulationError, match=">= 0"):
        em.before_send("us", -1)


def test_paths_from_other_sources_are_ignored() -> None:
    em, _ = make({("us", "eu"): LinkPath(delay_s=9.0)}, local="eu")
    with pytest.raises(EmulationError):
        em.before_send("us", 1)


def test_from_topology_halves_rtt_and_scales_bandwidth_only_when_asked() -> None:
    topo = topology_from_dict({
        "regions": {"eu": {}, "us": {}, "ap": {}},
        "links": [
            {"a": "us", "b": "eu", "bandwidth_gbps": 0.8, "rtt_ms": 80},
            {"a": "eu", "b": "eu", "bandwidth_gbps": 16, "rtt_ms": 2},
        ],
    })  # fmt: skip
    cfg = LinkEmulatorConfig.from_topology(topo, "eu", scale=4, shape_bandwidth=True)
    assert cfg.paths == {
        ("eu", "us"): LinkPath(delay_s=0.04, bandwidth_bps=0.8e9 / 8 / 4),
        ("eu", "eu"): LinkPath(delay_s=0.001, bandwidth_bps=16e9 / 8 / 4),
    }
    delay_only = LinkEmulatorConfig.from_topology(topo, "eu", scale=4)
    assert delay_only.paths[("eu", "us")] == LinkPath(delay_s=0.04)
    with pytest.raises(EmulationError, match="eu -> ap"):  # no link in the scenario
        LinkEmulator(delay_only).before_send("ap", 1)
    with pytest.raises(ConfigError, match="not a scenario region"):
        LinkEmulatorConfig.from_topology(topo, "mars")
    with pytest.raises(ConfigError, match="scale"):
        LinkEmulatorConfig.from_topology(topo, "eu", scale=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"delay_s": -1.0}, "delay_s"), ({"delay_s": float("nan")}, "delay_s"), ({"delay_s": 0.0, "bandwidth_bps": 0.0}, "bandwidth")],
)
def test_path_validation_says_the_fix(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        LinkPath(**kwargs)


sends = st.lists(
    st.tuples(st.floats(0, 0.5), st.sampled_from(["us", "ap"]), st.integers(0, 3 * MB)), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None)
@given(sends)
def test_fifo_properties(seq: list[tuple[float, str, int]]) -> None:
    paths = {("eu", "us"): LinkPath(delay_s=0.04, bandwidth_bps=10 * MB), ("eu", "ap"): LinkPath(delay_s=0.1, bandwidth_bps=2 * MB)}
    em, clock = make(paths)
    first: dict[str, float] = {}
    total: dict[str, int] = {}
    last_arrival: dict[str, float] = {}
    for dt, dst, n in seq:
        clock.t += dt
        wait = em.before_send(dst, n)
        arrival = clock.t + wait
        assert wait >= em.delay_for(dst, n) - 1e-9  # never faster than an idle link
        assert arrival >= last_arrival.get(dst, 0.0) - 1e-9  # FIFO per destination
        last_arrival[dst] = arrival
        first.setdefault(dst, clock.t)
        total[dst] = total.get(dst, 0) + n
        rate = paths[("eu", dst)].bandwidth_bps
        assert rate is not None
        # the link cannot carry more than its rate since the first send
        assert arrival >= first[dst] + total[dst] / rate + paths[("eu", dst)].delay_s - 1e-9
