"""Peers that share a machine's cores: the CPU floor under an inner step.

The simulator times an inner step by its critical path (1F1B over the links).
That is right when every peer has its own accelerator. When several peers
share one machine's cores (CPU peers, an emulated swarm on one box, a test
rig), the step can't be shorter than the CPU work those peers do per step over
the cores they have:

.. math:: T_{\\mathrm{host}} = \\frac{\\sum_{p \\in h} c_p}{\\mathrm{cores} - \\mathrm{reserved}}, \\qquad
          c_p = \\frac{F_p}{R} + s + m\\,n_p + r\\,\\frac{N_p}{10^6 H}

with :math:`F_p` the FLOPs of peer :math:`p`'s stage per inner step, :math:`R`
what one core achieves on them (``cpu_tflops``), :math:`s` fixed CPU per step
(optimizer step, data, bookkeeping), :math:`n_p` pipeline messages the peer
sends or receives per step (activations, their gradients, tied-weight
gradients) at :math:`m` each, and :math:`N_p` parameters it syncs every
:math:`H` steps at :math:`r` per million (pseudo-gradient, codecs, outer
step). ``reserved`` cores go to what is not training (DHT daemons, p2pd, a
coordinator). Every pipeline with a peer on host :math:`h` steps no faster
than :math:`T_{\\mathrm{host}}`. ``benchmarks.simval`` fits the terms on
calibration runs (per-peer CPU seconds from the report's ``peer_stats``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from geotrain.errors import ConfigError
from geotrain.planner import CostModel, StageAssignment

__all__ = ["HostModel", "peer_cpu_terms"]


@dataclass(frozen=True, kw_only=True)
class HostModel:
    """Which peers share a machine, how many cores it has, and what their work costs in CPU seconds."""

    cores: float
    host_of: Mapping[str, str] = field(default_factory=dict)  # peer id -> host; others have a machine each
    reserved_cores: float = 0.0
    cpu_tflops: float = 0.0  # 0: forward/backward costs no CPU (an accelerator does it)
    step_cpu_s: float = 0.0
    message_cpu_s: float = 0.0
    round_cpu_s_per_mparam: float = 0.0

    def __post_init__(self) -> None:
        if not self.cores > 0:
            raise ConfigError(f"host cores must be > 0; got {self.cores}")
        if not 0 <= self.reserved_cores < self.cores:
            raise ConfigError(f"host reserved_cores must be in [0, cores); got {self.reserved_cores} of {self.cores}")
        for name in ("cpu_tflops", "step_cpu_s", "message_cpu_s", "round_cpu_s_per_mparam"):
            if getattr(self, name) < 0:
                raise ConfigError(f"host {name} must be >= 0; got {getattr(self, name)}")

    def peer_cpu_s(self, terms: Sequence[float]) -> float:
        """CPU seconds per inner step from :func:`peer_cpu_terms`."""
        tflop, one, msgs, mparam_per_round = terms
        compute = tflop / self.cpu_tflops if self.cpu_tflops > 0 else 0.0
        return compute + self.step_cpu_s * one + self.message_cpu_s * msgs \
            + self.round_cpu_s_per_mparam * mparam_per_round

    def floors(self, cm: CostModel, pipelines: Sequence[Sequence[StageAssignment]]) -> list[float]:
        """Per pipeline, the shortest inner step its hosts allow (0 for pipelines on machines of their own)."""
        load: dict[str, float] = {}
        for pipe in pipelines:
            for s, st in enumerate(pipe):
                host = self.host_of.get(st.peer)
                if host is not None:
                    load[host] = load.get(host, 0.0) + self.peer_cpu_s(peer_cpu_terms(cm, pipe, s))
        avail = self.cores - self.reserved_cores
        return [max((load[h] / avail for st in pipe if (h := self.host_of.get(st.peer)) is not None), default=0.0)
                for pipe in pipelines]


def peer_cpu_terms(cm: CostModel, pipe: Sequence[StageAssignment], s: int) -> tuple[float, float, float, float]:
    """What stage ``s`` of ``pipe`` does per inner step, as the regressors of :class:`HostModel`:
    ``(TFLOPs, 1, messages sent + received, million synced parameters / H)``."""
    st = pipe[s]
    a, b = st.layers
    tflop = cm.M * cm.stage_compute_s(a, b, 1e12)  # seconds at 1 TFLOP/s = TFLOPs
    n = len(pipe)
    neighbours = (s > 0) + (s < n - 1)
    msgs = 2 * cm.M * neighbours  # each boundary: M activations one way, M gradients back, each sent and received
    if cm.tied and n > 1 and s in (0, n - 1):
        msgs += 2  # the tied weight's gradient, sent to and received from the other end
    params = (cm.params[b] - cm.params[a]) / cm.d
    return tflop, 1.0, float(msgs), params / 1e6 / cm.H
