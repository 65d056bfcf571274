"""The plan: the one object that owns the shape of a run.

What is a plan? For one job and one version: which peer runs which stage
(a contiguous block range) of which pipeline, which peers wait as spares,
the codec of every hop, and the step at which training stops. The coordinator
publishes it on the DHT (signed); every peer reads the newest version and
(re)builds its part. Versions only grow; a peer ignores older ones.

What is a stage group? The peers that hold the same blocks in different
pipelines. When pipelines cut the model at different places, a peer's stage
spans several *segments* (maximal block ranges whose holders are the same
set of peers); each segment is synced within its own group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from geotrain.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class StageSlot:
    """One stage of one pipeline: who runs it and which blocks ``[start, end)``."""

    peer: str
    start: int
    end: int
    endpoint: str = ""
    region: str = ""
    curve_public_key: str | None = None

    @property
    def layers(self) -> tuple[int, int]:
        return (self.start, self.end)


@dataclass(frozen=True, kw_only=True)
class SyncGroup:
    """Peers that hold the blocks ``[start, end)`` and sync them together every round."""

    start: int
    end: int
    members: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"b{self.start}-{self.end}"


@dataclass(frozen=True, kw_only=True)
class JobPlan:
    job_id: str
    version: int
    pipelines: tuple[tuple[StageSlot, ...], ...]
    spares: tuple[str, ...] = ()
    activation_codec: str = "fp16"
    activation_grad_codec: str = "fp16"
    sync_codec: str = "int8"
    intra_codec: str = "none"
    #: per pipeline, per hop i -> i+1: (activation codec, activation-grad codec); chosen by link.
    hop_codecs: tuple[tuple[tuple[str, str], ...], ...] = ()
    #: the step the plan's numbering starts at: its data position, round schedule and learning-rate step
    start_step: int = 0
    #: the oldest committed state a peer may start this plan from (own, stored or fetched); None: ``start_step``.
    #: A replan starts its numbering at the furthest live peer's round boundary, so steps never go back, while
    #: the state it may start from is as old as the slowest live peer's (see ``coordinator.decide``)
    state_step: int | None = None
    stop_step: int | None = None
    #: where stage groups write checkpoints; with ``resume_step`` peers start from that checkpoint
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # inner steps between checkpoints (0 = none)
    resume_step: int | None = None
    num_blocks: int = 0
    predicted: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.version < 1:
            raise ConfigError(f"plan.version must be >= 1; got {self.version}")
        if self.start_step < 0 or not (self.state_step is None or 0 <= self.state_step <= self.start_step):
            raise ConfigError(f"plan.state_step must be in [0, start_step]; got state_step {self.state_step}, "
                              f"start_step {self.start_step}")
        if not self.pipelines:
            raise ConfigError("a plan needs at least one pipeline")
        seen: set[str] = set()
        for p, pipe in enumerate(self.pipelines):
            if not pipe:
                raise ConfigError(f"pipeline {p} has no stages")
            if pipe[0].start != 0 or pipe[-1].end != self.num_blocks:
                raise ConfigError(f"pipeline {p} must cover blocks 0..{self.num_blocks}")
            for a, b in zip(pipe, pipe[1:], strict=False):
                if a.end != b.start:
                    raise ConfigError(f"pipeline {p}: stages must be contiguous ({a.layers} then {b.layers})")
            for slot in pipe:
                if slot.start >= slot.end:
                    raise ConfigError(f"pipeline {p}: empty stage {slot.layers}")
                if slot.peer in seen:
                    raise ConfigError(f"peer {slot.peer} appears twice in the plan")
                seen.add(slot.peer)

    # -- queries ------------------------------------------------------------------------------
    def slot_of(self, peer: str) -> tuple[int, int] | None:
        """(pipeline, stage) of ``peer``, or None when it is a spare or absent."""
        for p, pipe in enumerate(self.pipelines):
            for s, slot in enumerate(pipe):
                if slot.peer == peer:
                    return p, s
        return None

    def slot(self, pipeline: int, stage: int) -> StageSlot:
        return self.pipelines[pipeline][stage]

    @property
    def state_floor(self) -> int:
        """The step no committed state this plan starts from may predate."""
        return self.start_step if self.state_step is None else self.state_step

    @property
    def peers(self) -> list[str]:
        return [slot.peer for pipe in self.pipelines for slot in pipe]

    def collector(self, region: str) -> str | None:
        """The peer that gathers ``region``'s progress into one digest (:mod:`geotrain.swarm.digest`): its first
        plan peer in pipeline order that others can dial (None when the plan has none there). Every peer derives
        the same one from the plan."""
        if not region:
            return None
        for pipe in self.pipelines:
            for slot in pipe:
                if slot.region == region and slot.endpoint.startswith("tcp://"):
                    return slot.peer
        return None

    def spare_collector(self, region: str) -> str | None:
        """Where a spare of ``region`` sends its progress line: its region's collector, else (no plan peer
        there) the first region's."""
        first = next((s.region for pipe in self.pipelines for s in pipe if s.endpoint.startswith("tcp://")), "")
        return self.collector(region) or self.collector(first)

    def region_of(self, peer: str) -> str:
        """The region the plan placed ``peer`` in ("" for a spare or a peer not in the plan)."""
        for pipe in self.pipelines:
            for slot in pipe:
                if slot.peer == peer:
                    return slot.region
        return ""

    def hop_codec(self, pipeline: int, hop: int) -> tuple[str, str]:
        """(activation, activation-grad) codec of the hop from stage ``hop`` to ``hop + 1``."""
        if pipeline < len(self.hop_codecs) and hop < len(self.hop_codecs[pipeline]):
            return self.hop_codecs[pipeline][hop]
        return (self.activation_codec, self.activation_grad_codec)

    def sync_groups(self) -> list[SyncGroup]:
        """Segments of blocks with the same holders, each with its holders (pipeline order)."""
        cuts = sorted({b for pipe in self.pipelines for slot in pipe for b in (slot.start, slot.end)})
        groups: list[SyncGroup] = []
        for start, end in zip(cuts, cuts[1:], strict=False):
            members = tuple(
                slot.peer for pipe in self.pipelines for slot in pipe if slot.start <= start and end <= slot.end
            )
            if groups and groups[-1].members == members and groups[-1].end == start:
                groups[-1] = SyncGroup(start=groups[-1].start, end=end, members=members)
            else:
                groups.append(SyncGroup(start=start, end=end, members=members))
        return groups

    def groups_of(self, peer: str) -> list[SyncGroup]:
        return [g for g in self.sync_groups() if peer in g.members]

    # -- (de)serialisation: the DHT carries plans as JSON-able dicts ----------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "version": self.version,
            "pipelines": [
                [
                    {
                        "peer": s.peer,
                        "layers": [s.start, s.end],
                        "endpoint": s.endpoint,
                        "region": s.region,
                        "curve_public_key": s.curve_public_key,
                    }
                    for s in pipe
                ]
                for pipe in self.pipelines
            ],
            "spares": list(self.spares),
            "codecs": {
                "activation": self.activation_codec,
                "activation_grad": self.activation_grad_codec,
                "sync": self.sync_codec,
                "intra": self.intra_codec,
                "hops": [[list(h) for h in pipe] for pipe in self.hop_codecs],
            },
            "start_step": self.start_step,
            "state_step": self.state_step,
            "stop_step": self.stop_step,
            "checkpoint": {"dir": self.checkpoint_dir, "every": self.checkpoint_every, "resume_step": self.resume_step},
            "num_blocks": self.num_blocks,
            "predicted": dict(self.predicted),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobPlan:
        """Parse a plan read from the DHT; anything malformed is a ConfigError."""
        try:
            codecs = d.get("codecs", {})
            pipelines = tuple(
                tuple(
                    StageSlot(
                        peer=str(s["peer"]),
                        start=int(s["layers"][0]),
                        end=int(s["layers"][1]),
                        endpoint=str(s.get("endpoint", "")),
                        region=str(s.get("region", "")),
                        curve_public_key=s.get("curve_public_key"),
                    )
                    for s in pipe
                )
                for pipe in d["pipelines"]
            )
            hops = tuple(tuple((str(h[0]), str(h[1])) for h in pipe) for pipe in codecs.get("hops", []))
            stop = d.get("stop_step")
            ckpt = d.get("checkpoint") or {}
            resume = ckpt.get("resume_step")
            return cls(
                job_id=str(d["job_id"]),
                version=int(d["version"]),
                pipelines=pipelines,
                spares=tuple(str(p) for p in d.get("spares", [])),
                activation_codec=str(codecs.get("activation", "fp16")),
                activation_grad_codec=str(codecs.get("activation_grad", "fp16")),
                sync_codec=str(codecs.get("sync", "int8")),
                intra_codec=str(codecs.get("intra", "none")),
                hop_codecs=hops,
                start_step=int(d.get("start_step", 0)),
                state_step=None if d.get("state_step") is None else int(d["state_step"]),
                stop_step=None if stop is None else int(stop),
                checkpoint_dir=None if ckpt.get("dir") is None else str(ckpt["dir"]),
                checkpoint_every=int(ckpt.get("every", 0)),
                resume_step=None if resume is None else int(resume),
                num_blocks=int(d["num_blocks"]),
                predicted=dict(d.get("predicted", {})),
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"malformed plan: {type(e).__name__}: {e}") from None
