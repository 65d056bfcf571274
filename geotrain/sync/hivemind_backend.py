"""The baseline backend: the same DiLoCo outer loop, all-reduced by hivemind's DecentralizedAverager.

This is the OpenDiLoCo recipe (Jaghouar et al. 2024, on DiLoCo, arXiv
2311.08105): every ``every`` inner steps each peer puts its pseudo-gradient in
a hivemind averager, which forms a group over the DHT and runs a flat
butterfly all-reduce (each peer owns one part of the vector) with a hivemind
codec, fp16 by default. No hierarchy, no fragments, no overlap: benchmarks
compare :class:`~geotrain.sync.DiLoCoSync` against it.

Byte accounting: hivemind does not report bytes per link, so :attr:`stats`
is computed from its routing: peer ``i`` sends part ``j`` of its vector to
peer ``j`` and part ``i`` of the average back to every other peer, each part
serialized with the averager's codec (its real protobuf size). A part sent
to a peer of another region counts as cross-region (``peer_regions``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from geotrain.errors import ConfigError
from geotrain.sync.config import DiLoCoConfig
from geotrain.sync.membership import RoundId
from geotrain.sync.outer import Fragment, OuterState, commit, split_fragments
from geotrain.sync.round import RoundOutcome, RoundStatus, SyncStats

__all__ = ["HivemindDiLoCoSync"]

logger = logging.getLogger(__name__)


def hivemind_compression(name: str) -> Any:
    """A hivemind codec by short name: "none", "fp16", "uniform8", "quantile8"."""
    from hivemind.compression import (
        Float16Compression,
        NoCompression,
        Quantile8BitQuantization,
        Uniform8BitQuantization,
    )

    table = {
        "none": NoCompression,
        "fp16": Float16Compression,
        "uniform8": Uniform8BitQuantization,
        "quantile8": Quantile8BitQuantization,
    }
    if name not in table:
        raise ConfigError(f"hivemind compression must be one of {sorted(table)}; got {name!r}")
    return table[name]()


class HivemindDiLoCoSync:
    """One peer's DiLoCo outer loop on a hivemind ``DecentralizedAverager`` (flat; fragments = 1).

    ``dht`` is a running ``hivemind.DHT``; ``group_size`` peers average together
    (the stage group); ``prefix`` names the group on the DHT.
    """

    def __init__(
        self,
        config: DiLoCoConfig,
        *,
        params: Sequence[tuple[str, nn.Parameter]],
        dht: Any,
        region: str,
        group_size: int,
        prefix: str,
        compression: str = "fp16",
        matchmaking_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from hivemind.averaging import DecentralizedAverager

        if config.fragments != 1 or config.overlap != 0:
            raise ConfigError("the hivemind backend is flat DiLoCo: set sync.fragments = 1 and sync.overlap = 0")
        if group_size < 2:
            raise ConfigError(f"group_size must be >= 2; got {group_size}")
        self.config = config
        self.clock = clock
        self.region = region
        self.fragment: Fragment = split_fragments(list(params), 1)[0]
        self.outer = OuterState(self.fragment.flat(), config)
        self.peer_id = str(dht.peer_id)
        self.peer_regions: dict[str, str] = {self.peer_id: region}
        self.stats = SyncStats()
        self.history: list[RoundOutcome] = []
        self._compression = hivemind_compression(compression)
        self._averager = DecentralizedAverager(
            [torch.zeros(self.fragment.numel)],
            dht,
            start=True,
            prefix=prefix,
            target_group_size=group_size,
            min_group_size=group_size,
            min_matchmaking_time=matchmaking_s,
            request_timeout=matchmaking_s / 2,  # hivemind warns (deadlock risk) unless it is below matchmaking
            compression=self._compression,
        )

    def set_peer_regions(self, regions: Mapping[str, str]) -> None:
        """hivemind peer id (str) -> region, for cross-region byte accounting."""
        self.peer_regions.update(regions)

    def global_flat(self) -> torch.Tensor:
        return self.outer.global_flat

    def after_inner_step(self, step: int) -> list[RoundOutcome]:
        if step <= 0 or step % self.config.every:
            return []
        rid = RoundId(0, step // self.config.every)
        t0 = self.clock()
        pseudo_grad = self.outer.global_flat - self.fragment.flat()  # (N,)
        with self._averager.get_tensors() as tensors:
            tensors[0].copy_(pseudo_grad)
        deadline = self.config.deadline_s(8 * self.fragment.numel)
        try:
            # DiLoCo's round is synchronous: a peer that reaches step H first keeps looking for its group
            # until the deadline (one failed matchmaking attempt of min_matchmaking_time would otherwise
            # abandon the round whenever the peers arrive further apart than that, and they then drift apart)
            # hivemind's timeout bounds the search for a group, not the all-reduce that follows: a group with a
            # member that stopped answering held every other one in step() for good (seen in a benchmark run),
            # so the whole round is bounded here too, by twice the deadline
            control = self._averager.step(timeout=deadline, allow_retries=True, wait=False)
            try:
                gathered = control.result(timeout=2 * deadline)
            except concurrent.futures.TimeoutError:
                control.cancel()
                raise TimeoutError(f"no group averaged within {2 * deadline:.0f}s") from None
        except Exception as e:  # hivemind raises assorted errors on a failed group; the round is discarded
            gathered = None
            logger.warning("hivemind all-reduce failed: %s: %s", type(e).__name__, e)
        if not gathered:
            outcome = RoundOutcome(rid, RoundStatus.ABANDONED, reason="hivemind averager formed no group in time")
            self.stats.rounds_discarded += 1
        else:
            with self._averager.get_tensors() as tensors:
                delta = tensors[0].clone()
            peers = sorted(str(p) for p in gathered)
            outcome = RoundOutcome(rid, RoundStatus.COMMITTED, delta, tuple(peers))
            self._count_bytes(pseudo_grad, peers)
            commit(self.fragment, self.outer, delta, counted=True)
            self.stats.rounds_committed += 1
        outcome.seconds = self.clock() - t0
        self.stats.round_s += outcome.seconds
        self.stats.wait_s += outcome.seconds  # blocking: the inner loop waits for the whole round
        self.history.append(outcome)
        return [outcome]

    def _count_bytes(self, vector: torch.Tensor, peers: list[str]) -> None:
        from hivemind.compression import serialize_torch_tensor

        parts = torch.tensor_split(vector, len(peers))
        sizes = [serialize_torch_tensor(p, self._compression.compression_type).ByteSize() for p in parts]
        me = peers.index(self.peer_id) if self.peer_id in peers else 0
        mine = self.peer_regions.get(self.peer_id)
        for j, peer in enumerate(peers):
            if j == me:
                continue
            sent = sizes[j] + sizes[me]  # my part j to its owner, then my averaged part back to it
            if self.peer_regions.get(peer) != mine:
                self.stats.bytes_cross += sent
            else:
                self.stats.bytes_intra += sent

    def shutdown(self) -> None:
        self._averager.shutdown()
