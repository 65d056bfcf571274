"""A whole pipeline inside one process: one thread and one real loopback Transport per stage.

Used by tests, the benchmark and examples. Every stage talks over real ZMQ
sockets on 127.0.0.1 exactly as separate peers would; only the processes are
shared. Stage ``s`` is peer ``"{name}-s{s}"``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.models.blocks import BlockModel
from geotrain.models.stage import build_stage
from geotrain.pipeline.config import StageConfig
from geotrain.pipeline.runtime import StageRuntime, StepMetrics
from geotrain.transport import Transport, TransportConfig

__all__ = ["LocalPipeline"]


class LocalPipeline:
    """``len(layers)`` stages of ``model`` in threads; ``config`` is a template (its ``stage`` is replaced).

    ``codecs``: optional per-hop ``(act_codec, grad_codec)``, hop ``s`` being stage s -> s + 1.
    ``emulator``: optional factory ``stage -> LinkEmulator`` for shaped links.
    ``local``: optional ``(LocalRanks, ModelSection)`` by stage: that stage spread over the local ranks
    (:mod:`geotrain.peers.ranks`; ``model`` must be the one the section builds).
    """

    def __init__(
        self,
        model: BlockModel,
        layers: Sequence[tuple[int, int]],
        config: StageConfig,
        *,
        seed: int,
        data: Callable[[int], torch.Tensor],
        codecs: Sequence[tuple[str, str]] | None = None,
        name: str = "pp",
        transport_config: TransportConfig | None = None,
        emulator: Callable[[int], Any] | None = None,
        optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer] | None = None,
        local: dict[int, tuple[Any, Any]] | None = None,
    ) -> None:
        n = len(layers)
        self.peers = [f"{name}-s{s}" for s in range(n)]
        tcfg = transport_config or TransportConfig()
        self.transports = [
            Transport(tcfg, peer_id=p, region=f"r{s}", emulator=emulator(s) if emulator else None).start()
            for s, p in enumerate(self.peers)
        ]
        try:
            for s, t in enumerate(self.transports):
                for o, other in enumerate(self.transports):
                    if o != s:
                        t.connect(self.peers[o], other.address, region=f"r{o}")
            self.stages = [build_stage(model, r, seed) for r in layers]
            for s, (ranks, section) in (local or {}).items():
                ranks.build(section, layers[s], seed, self.stages[s], compute_dtype=config.compute_dtype)
            self.runtimes: list[StageRuntime] = []
            for s, st in enumerate(self.stages):
                act, grad = "none", "none"
                if codecs is not None:
                    act = codecs[s][0] if s < n - 1 else "none"
                    grad = codecs[s - 1][1] if s > 0 else "none"
                cfg = dataclasses.replace(config, stage=s, num_stages=n, act_codec=act, grad_codec=grad)
                self.runtimes.append(
                    StageRuntime(
                        cfg,
                        stage=st,
                        transport=self.transports[s],
                        prev_peer=self.peers[s - 1] if s > 0 else None,
                        next_peer=self.peers[s + 1] if s < n - 1 else None,
                        end_peer=self.peers[n - 1 - s] if s in (0, n - 1) and n > 1 else None,
                        data=data if s == 0 or (s == n - 1 and not cfg.targets_from_first) else None,
                        optimizer=optimizer(st) if optimizer else None,
                        local=(local or {}).get(s, (None, None))[0],
                    )
                )
        except BaseException:
            self.close()
            raise
        self._pool = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix=f"{name}-stage")

    def _all(self, fn: Callable[[StageRuntime], Any]) -> list[Any]:
        futures = [self._pool.submit(fn, rt) for rt in self.runtimes]
        return [f.result() for f in futures]  # re-raises the first stage's failure in order

    def step(self, step: int) -> list[StepMetrics]:
        """One inner step on every stage; per-stage metrics in stage order."""
        return self._all(lambda rt: rt.run_inner_step(step))

    def forward_backward(self, step: int, *, sync_tied: bool = True) -> float:
        """Gradients of ``step`` left in place (no optimizer step); returns the loss."""

        def one(rt: StageRuntime) -> float | None:
            loss, _, _ = rt.forward_backward(step)
            if sync_tied:
                rt.sync_tied_grads(step)
            return loss

        loss = self._all(one)[-1]
        assert loss is not None
        return float(loss)

    def evaluate(self, eval_id: int, batches: Sequence[torch.Tensor]) -> float:
        """Validation loss of the pipeline over ``batches`` (forward only, over the hops)."""
        loss = self._all(lambda rt: rt.run_eval(eval_id, batches.__getitem__, len(batches)))[-1]
        assert loss is not None
        return float(loss)

    def named_grads(self) -> dict[str, torch.Tensor]:
        """Every stage's parameter gradients by global name (a tied copy under each stage's own name)."""
        return {n: p.grad for st in self.stages for n, p in st.named_parameters() if p.grad is not None}

    def close(self) -> None:
        for rt in getattr(self, "runtimes", []):
            rt.close()
        if hasattr(self, "_pool"):
            self._pool.shutdown(wait=True, cancel_futures=True)
        for t in self.transports:
            t.close()

    def __enter__(self) -> LocalPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
