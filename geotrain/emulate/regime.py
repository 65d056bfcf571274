"""Regimes: real deployments, and the emulated links that reproduce their ratios on this machine (pure).

A *regime* is what a user runs: a model of ``params`` parameters, each peer one
accelerator of ``peer_flops`` peak FLOP/s at ``mfu`` model FLOP utilisation,
training ``tokens_per_step_per_peer`` tokens per inner step, with synchronous
data parallel sending ``dp_bytes_per_param`` bytes per parameter per step
(2: bf16 gradients), over links of ``wan_gbit`` Gbit/s and ``wan_rtt_ms`` between
regions and ``lan_gbit``/``lan_rtt_ms`` inside one.

Two ratios describe how a regime feels to a training algorithm:

- the *DP communication-to-compute ratio* ``c = t_comm / t_compute``, where
  ``t_compute = 6 * params * tokens_per_step_per_peer / (peer_flops * mfu)`` (forward +
  backward FLOPs of one step) and ``t_comm = 2 (n - 1) / n * params * dp_bytes_per_param * 8
  / (wan_gbit * 1e9)`` (a bandwidth-optimal ring all-reduce of the gradients among
  ``n`` peers);
- the *RTT-to-step ratio* ``r = wan_rtt / t_compute``.

*Time dilation* maps them onto this machine: with the benchmark's own model
(``bench_params``, all-reduced at ``bench_dp_bytes_per_param``) taking a measured
``step_s`` per inner step under the benchmark's load, every emulated link gets
the bandwidth and delay that give the same ratios::

    bandwidth_emulated = 2 (n - 1) / n * bench_params * bench_dp_bytes_per_param / (c * step_s)   (bytes/s)
    rtt_emulated       = r * step_s

``wan_gbit`` is each peer's own link. The emulation shapes one link per
region pair, shared by the region's peers, and DP's ring (peers placed in
regions round-robin) runs ``k`` = peers-per-region flows over each region pair
at once; so a region pair gets ``k x bandwidth_emulated`` (``peers_per_region``).

and the same for the links inside a region with ``lan_gbit``/``lan_rtt_ms``.
The whole network is slowed by the factor by which this machine's step is
slower than the regime's (and scaled by the ratio of the models' sizes).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from geotrain.errors import ConfigError

FIELDS = ("name", "params", "tokens_per_step_per_peer", "peer_flops", "mfu", "dp_bytes_per_param", "wan_gbit",
          "wan_rtt_ms", "lan_gbit", "lan_rtt_ms")


@dataclass(frozen=True, kw_only=True)
class Regime:
    """One deployment users run (see the module docstring for each field's meaning and units)."""

    name: str
    params: float
    tokens_per_step_per_peer: float
    peer_flops: float
    mfu: float
    dp_bytes_per_param: float
    wan_gbit: float
    wan_rtt_ms: float
    lan_gbit: float
    lan_rtt_ms: float

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("regime.name must be a non-empty string")
        for f in FIELDS[1:]:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"regime {self.name!r}: {f} must be a finite number; got {v!r}")
            if v < 0 or (v == 0 and f not in ("wan_rtt_ms", "lan_rtt_ms")):
                raise ConfigError(f"regime {self.name!r}: {f} must be > 0 (rtt >= 0); got {v}")
        if self.mfu > 1:
            raise ConfigError(f"regime {self.name!r}: mfu is a fraction of peak in (0, 1]; got {self.mfu}")

    @property
    def compute_s(self) -> float:
        """Seconds of one inner step's forward + backward: 6 x params x tokens / (peer_flops x mfu)."""
        return 6 * self.params * self.tokens_per_step_per_peer / (self.peer_flops * self.mfu)

    def allreduce_s(self, peers: int, gbit: float) -> float:
        """Seconds of a ring all-reduce of the gradients among ``peers`` over ``gbit`` Gbit/s links."""
        return ring_factor(peers) * self.params * self.dp_bytes_per_param * 8 / (gbit * 1e9)

    def comm_to_compute(self, peers: int, *, lan: bool = False) -> float:
        """The DP communication-to-compute ratio per step (over the WAN, or the LAN with ``lan``)."""
        return self.allreduce_s(peers, self.lan_gbit if lan else self.wan_gbit) / self.compute_s

    def rtt_to_step(self, *, lan: bool = False) -> float:
        """Round-trip time over the step's compute time."""
        return (self.lan_rtt_ms if lan else self.wan_rtt_ms) / 1e3 / self.compute_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ring_factor(peers: int) -> float:
    """``2 (n - 1) / n``: the fraction of the vector each peer sends in a ring all-reduce among ``n`` peers."""
    if peers < 2:
        raise ConfigError(f"a regime needs >= 2 peers to all-reduce; got {peers}")
    return 2 * (peers - 1) / peers


BUILTIN: dict[str, Regime] = {
    # 1B parameters, one H100 per peer (989 TFLOP/s dense bf16) at 40% MFU, 64k tokens per step, bf16 gradients
    "1b-h100-1gbit": Regime(name="1b-h100-1gbit", params=1e9, tokens_per_step_per_peer=65536, peer_flops=989e12,
                            mfu=0.4, dp_bytes_per_param=2, wan_gbit=1.0, wan_rtt_ms=80.0, lan_gbit=100.0,
                            lan_rtt_ms=0.1),
    # a 24 GB consumer GPU (RTX 4090 class, ~165 TFLOP/s dense bf16) at 40% MFU training a 500M model (16 bytes of
    # weights + Adam state per parameter = 8 GB, the rest for activations), 16k tokens per step, home links
    "consumer-80mbit": Regime(name="consumer-80mbit", params=5e8, tokens_per_step_per_peer=16384, peer_flops=165e12,
                              mfu=0.4, dp_bytes_per_param=2, wan_gbit=0.08, wan_rtt_ms=40.0, lan_gbit=1.0,
                              lan_rtt_ms=0.5),
}  # fmt: skip


def regime_from_dict(raw: Mapping[str, Any]) -> Regime:
    """A regime from parsed JSON; every field of :data:`FIELDS` is required, nothing else is allowed."""
    if not isinstance(raw, Mapping):
        raise ConfigError("a regime must be a JSON object with " + ", ".join(FIELDS))
    missing = [f for f in FIELDS if f not in raw]
    extra = sorted(set(raw) - set(FIELDS))
    if missing or extra:
        raise ConfigError(f"regime: missing {missing}, unknown {extra}; a regime has exactly {list(FIELDS)}")
    return Regime(**{f: raw[f] for f in FIELDS})


def load_regime(name_or_path: str) -> Regime:
    """A built-in regime by name (:data:`BUILTIN`), else a JSON file."""
    if name_or_path in BUILTIN:
        return BUILTIN[name_or_path]
    p = Path(name_or_path)
    if not p.is_file():
        raise ConfigError(f"--regime {name_or_path!r} is neither a built-in ({', '.join(BUILTIN)}) nor a JSON file")
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{p}: cannot read the regime: {e}") from None
    return regime_from_dict(raw)


@dataclass(frozen=True, kw_only=True)
class RegimeMapping:
    """A regime mapped onto this machine: the emulated links (bytes/s and seconds) and the ratios they keep."""

    regime: Regime
    peers: int
    peers_per_region: int
    bench_params: int
    bench_dp_bytes_per_param: float
    step_s: float
    comm_to_compute: float
    rtt_to_step: float
    dilation: float  # step_s / regime.compute_s: how much slower this machine's step is
    wan_bandwidth_bps: float  # one region pair's link (peers_per_region x each peer's share)
    wan_rtt_s: float
    lan_bandwidth_bps: float
    lan_rtt_s: float

    def emulated_comm_to_compute(self) -> float:
        """The ratio the emulated WAN gives the benchmark's DP (equals ``comm_to_compute``)."""
        return ring_factor(self.peers) * self.bench_params * self.bench_dp_bytes_per_param / (
            self.wan_bandwidth_bps / self.peers_per_region * self.step_s)

    def describe(self) -> dict[str, Any]:
        """JSON-ready: regime figures, measured step, emulated Mbit/s and ms."""
        r = self.regime
        return {
            "regime": r.to_dict(),
            "regime_step_compute_s": r.compute_s,
            "regime_dp_allreduce_s": r.allreduce_s(self.peers, r.wan_gbit),
            "dp_comm_to_compute": self.comm_to_compute,
            "dp_comm_fraction": self.comm_to_compute / (1 + self.comm_to_compute),
            "rtt_to_step": self.rtt_to_step,
            "peers": self.peers,
            "peers_per_region": self.peers_per_region,
            "bench_params": self.bench_params,
            "bench_dp_bytes_per_param": self.bench_dp_bytes_per_param,
            "measured_step_s": self.step_s,
            "dilation": self.dilation,
            "wan_mbit": self.wan_bandwidth_bps * 8 / 1e6,
            "wan_mbit_per_peer": self.wan_bandwidth_bps / self.peers_per_region * 8 / 1e6,
            "wan_rtt_ms": self.wan_rtt_s * 1e3,
            "lan_mbit": self.lan_bandwidth_bps * 8 / 1e6,
            "lan_rtt_ms": self.lan_rtt_s * 1e3,
        }

    def scenario(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` (a scenario) with every region pair's link set to the emulated WAN, each region's own to the LAN."""
        regions = list(base["regions"])
        links = []
        for i, a in enumerate(regions):
            for b in regions[i:]:
                bw, rtt = (self.lan_bandwidth_bps, self.lan_rtt_s) if a == b else (self.wan_bandwidth_bps, self.wan_rtt_s)
                links.append({"a": a, "b": b, "bandwidth_gbps": bw * 8 / 1e9, "rtt_ms": rtt * 1e3})
        return {**base, "links": links}


def map_regime(regime: Regime, *, peers: int, bench_params: int, bench_dp_bytes_per_param: float,
               step_s: float, peers_per_region: int = 1) -> RegimeMapping:
    """The emulated links that give the benchmark's DP on this machine the regime's two ratios (time dilation).

    ``step_s``: this machine's measured compute time of one inner step of the
    benchmark's model under the benchmark's load; ``bench_params`` and
    ``bench_dp_bytes_per_param``: what the benchmark's DP all-reduces per step.
    """
    if peers_per_region < 1:
        raise ConfigError(f"peers_per_region must be >= 1; got {peers_per_region}")
    if not (math.isfinite(step_s) and step_s > 0):
        raise ConfigError(f"the measured step must be > 0 s; got {step_s}")
    if bench_params < 1 or not bench_dp_bytes_per_param > 0:
        raise ConfigError(f"bench_params and bench_dp_bytes_per_param must be > 0; got {bench_params}, "
                          f"{bench_dp_bytes_per_param}")
    ring_bytes = ring_factor(peers) * bench_params * bench_dp_bytes_per_param
    c_wan, c_lan = regime.comm_to_compute(peers), regime.comm_to_compute(peers, lan=True)
    return RegimeMapping(
        regime=regime, peers=peers, peers_per_region=peers_per_region, bench_params=bench_params, bench_dp_bytes_per_param=bench_dp_bytes_per_param,
        step_s=step_s, comm_to_compute=c_wan, rtt_to_step=regime.rtt_to_step(), dilation=step_s / regime.compute_s,
        wan_bandwidth_bps=peers_per_region * ring_bytes / (c_wan * step_s), wan_rtt_s=regime.rtt_to_step() * step_s,
        lan_bandwidth_bps=ring_bytes / (c_lan * step_s), lan_rtt_s=regime.rtt_to_step(lan=True) * step_s,
    )
