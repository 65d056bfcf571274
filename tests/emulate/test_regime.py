"""Regime mapping (geotrain.emulate.regime): the arithmetic of time dilation, exact on round numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geotrain.emulate.regime import BUILTIN, Regime, load_regime, map_regime, regime_from_dict, ring_factor
from geotrain.errors import ConfigError

EXACT = pytest.approx  # on these round figures only float rounding separates the sides

ROUND = Regime(name="round", params=1e9, tokens_per_step_per_peer=1e5, peer_flops=1e15, mfu=0.5,
               dp_bytes_per_param=2, wan_gbit=1.0, wan_rtt_ms=60.0, lan_gbit=100.0, lan_rtt_ms=0.6)


def test_regime_ratios() -> None:
    assert ROUND.compute_s == EXACT(1.2)  # 6 * 1e9 * 1e5 / (1e15 * 0.5)
    assert ring_factor(4) == 1.5
    assert ROUND.allreduce_s(4, 1.0) == EXACT(24.0)  # 1.5 * 2e9 B * 8 / 1e9 bit/s
    assert ROUND.comm_to_compute(4) == EXACT(20.0)
    assert ROUND.comm_to_compute(4, lan=True) == EXACT(0.2)
    assert ROUND.rtt_to_step() == EXACT(0.05)
    assert ROUND.rtt_to_step(lan=True) == EXACT(0.0005)


def test_mapping_keeps_both_ratios_on_this_machine() -> None:
    m = map_regime(ROUND, peers=4, bench_params=1_000_000, bench_dp_bytes_per_param=4, step_s=0.1)
    # ring bytes per peer: 1.5 * 1e6 * 4 = 6e6; WAN: 6e6 / (20 * 0.1) = 3e6 B/s = 24 Mbit/s; RTT 0.05 * 0.1 s
    assert m.wan_bandwidth_bps == EXACT(3e6)
    assert m.wan_rtt_s == EXACT(0.005)
    assert m.lan_bandwidth_bps == EXACT(3e8)  # 6e6 / (0.2 * 0.1)
    assert m.lan_rtt_s == EXACT(5e-5)
    assert m.dilation == EXACT(0.1 / 1.2)
    assert m.emulated_comm_to_compute() == EXACT(m.comm_to_compute)
    d = m.describe()
    assert d["wan_mbit"] == EXACT(24.0) and d["wan_rtt_ms"] == EXACT(5.0)
    assert d["dp_comm_fraction"] == EXACT(20 / 21) and d["measured_step_s"] == 0.1
    # two peers per region share each region pair's link: it gets twice each peer's share; the LAN is not shared
    m2 = map_regime(ROUND, peers=4, bench_params=1_000_000, bench_dp_bytes_per_param=4, step_s=0.1, peers_per_region=2)
    assert m2.wan_bandwidth_bps == EXACT(6e6) and m2.lan_bandwidth_bps == EXACT(3e8) and m2.wan_rtt_s == EXACT(0.005)
    assert m2.emulated_comm_to_compute() == EXACT(20.0)
    assert m2.describe()["wan_mbit_per_peer"] == EXACT(24.0)
    scen = m.scenario({"regions": {"a": {}, "b": {}}, "links": [], "peers": [1]})
    assert scen["peers"] == [1]
    assert scen["links"] == [
        {"a": "a", "b": "a", "bandwidth_gbps": EXACT(2.4), "rtt_ms": EXACT(0.05)},
        {"a": "a", "b": "b", "bandwidth_gbps": EXACT(0.024), "rtt_ms": EXACT(5.0)},
        {"a": "b", "b": "b", "bandwidth_gbps": EXACT(2.4), "rtt_ms": EXACT(0.05)},
    ]


def test_builtin_regimes() -> None:
    h100 = BUILTIN["1b-h100-1gbit"]
    assert h100.compute_s == EXACT(6e9 * 65536 / (989e12 * 0.4))  # ~0.994 s
    # the users' regime: a DP step over 1 Gbit/s spends > 90% of its time communicating
    c = h100.comm_to_compute(6)
    assert c / (1 + c) > 0.9
    consumer = BUILTIN["consumer-80mbit"]
    assert consumer.wan_gbit == 0.08 and consumer.wan_rtt_ms == 40.0
    assert consumer.params * 16 < 24e9  # weights + Adam state fit a 24 GB card


def test_regime_files_and_errors(tmp_path: Path) -> None:
    raw = ROUND.to_dict()
    f = tmp_path / "r.json"
    f.write_text(json.dumps(raw))
    assert load_regime(str(f)) == ROUND
    assert load_regime("1b-h100-1gbit") is BUILTIN["1b-h100-1gbit"]
    with pytest.raises(ConfigError, match="neither a built-in"):
        load_regime(str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="missing \\['mfu'\\]"):
        regime_from_dict({k: v for k, v in raw.items() if k != "mfu"})
    with pytest.raises(ConfigError, match="unknown \\['extra'\\]"):
        regime_from_dict({**raw, "extra": 1})
    with pytest.raises(ConfigError, match="mfu is a fraction"):
        regime_from_dict({**raw, "mfu": 40})
    with pytest.raises(ConfigError, match="wan_gbit must be > 0"):
        regime_from_dict({**raw, "wan_gbit": 0})
    with pytest.raises(ConfigError, match="measured step"):
        map_regime(ROUND, peers=4, bench_params=1, bench_dp_bytes_per_param=4, step_s=0.0)
    with pytest.raises(ConfigError, match=">= 2 peers"):
        map_regime(ROUND, peers=1, bench_params=1, bench_dp_bytes_per_param=4, step_s=0.1)
