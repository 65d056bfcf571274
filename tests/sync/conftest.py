"""A stage group of thread members, each with its own real Transport on loopback."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import pytest
import torch
from torch import nn

from geotrain.sync import DiLoCoConfig, DiLoCoSync, Member, RoundOutcome, StaticMembership
from geotrain.transport import Transport, TransportConfig


@dataclass
class Peer:
    transport: Transport
    sync: DiLoCoSync
    model: nn.Module

    @property
    def peer_id(self) -> str:
        return self.transport.peer_id

    def params(self) -> list[tuple[str, nn.Parameter]]:
        return list(self.model.named_parameters())


class Group:
    def __init__(self) -> None:
        self.peers: list[Peer] = []
        self.transports: list[Transport] = []
        self.pool = concurrent.futures.ThreadPoolExecutor(8)

    def build(
        self,
        regions: Sequence[str],
        config: DiLoCoConfig,
        make_model: Callable[[], nn.Module],
        *,
        configs: dict[int, DiLoCoConfig] | None = None,
        extra: Sequence[Member] = (),
    ) -> list[Peer]:
        transports = []
        for i, region in enumerate(regions):
            t = Transport(TransportConfig(), peer_id=f"p{i}", region=region).start()
            transports.append(t)
            self.transports.append(t)
        members = [Member(t.peer_id, t.region, t.address) for t in transports] + list(extra)
        membership = StaticMembership(members)
        for i, t in enumerate(transports):
            model = make_model()
            cfg = (configs or {}).get(i, config)
            sync = DiLoCoSync(cfg, params=list(model.named_parameters()), transport=t, membership=membership)
            self.peers.append(Peer(t, sync, model))
        return self.peers

    def step_all(self, step: int, peers: Sequence[Peer] | None = None, timeout: float = 60.0) -> list[list[RoundOutcome]]:
        """Every peer calls after_inner_step(step) at once, each in its own thread."""
        peers = self.peers if peers is None else peers
        futures = [self.pool.submit(p.sync.after_inner_step, step) for p in peers]
        return [f.result(timeout=timeout) for f in futures]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        for p in self.peers:
            if p.sync._pool is not None:
                p.sync._pool.shutdown(wait=False, cancel_futures=True)
        for t in self.transports:
            t.close()


@pytest.fixture
def group() -> Iterator[Group]:
    g = Group()
    try:
        yield g
    finally:
        g.close()


def exact_config(**overrides: object) -> DiLoCoConfig:
    """Outer lr 1, no momentum, no compression: a round's result is the plain average."""
    base = DiLoCoConfig(
        every=1, outer_lr=1.0, outer_momentum=0.0, nesterov=False, intra_codec="none", cross_codec="none",
        error_feedback=False, deadline_floor_s=2.0,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def seeded_model(seed: int = 0) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))

    return make


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
