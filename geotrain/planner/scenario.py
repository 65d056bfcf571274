"""A scenario: the swarm and the job the planner plans for.

A scenario is what ``geotrain plan --scenario FILE`` reads and what the
coordinator builds from DHT records; both go through :meth:`Scenario.from_dict`
(the one entry point), so a what-if plan and a live plan are made the same way.
The JSON format is documented in ``docs/scenario.md``::

    {"regions": {"us-east": {"egress_usd_per_gb": 0.02}, ...},
     "links":   [{"a": "us-east", "b": "eu-west", "bandwidth_gbps": 1.16, "rtt_ms": 76}, ...],
     "peers":   [{"id": "p0", "region": "us-east", "tflops": 100, "memory_gb": 32, "usd_per_hour": 2.5}, ...],
     "model":   {"layers": 24, "hidden": 2048, "seq_len": 2048, "vocab": 50257, "dtype_bytes": 2},
     "job":     {"micro_batch": 1, "micro_batches": 32, "sync_every": 100, "stages": null, "pipelines": null,
                 "activation_codec": "int8", "sync_codec": "int4", "objective": "throughput"}}

Words: a *link* joins two regions (``a == b`` is the link between two peers of
one region) or two peers (a measured pair; it overrides the regions' link).
A link is *directional*: its bandwidth is what ``a`` can send to ``b``. One
entry holds both ways; listing the reverse (``b`` to ``a``) as well gives that
direction its own figures (a home line with a 200 Mbit/s uplink and 1 Gbit/s
downlink is two entries).
``tflops`` is the peer's sustained training speed (measured, not the data-sheet
peak). ``bandwidth_gbps`` is Gbit/s, one direction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from geotrain.config import DEFAULT_SYNC_EVERY
from geotrain.errors import ConfigError, ScenarioError
from geotrain.planner.codecs import validate_codec
from geotrain.planner.objective import Objective
from geotrain.planner.profile import LayerProfile, transformer_profile


def _take(d: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    if not isinstance(d, Mapping):
        raise ScenarioError(f"{where} must be a JSON object; got {type(d).__name__}")
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def _num(d: Mapping[str, Any], key: str, where: str, *, default: Any = ..., positive: bool = False,
         integer: bool = False) -> Any:
    if key not in d or d[key] is None:
        if default is ...:
            raise ScenarioError(f"{where}.{key} is required")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ScenarioError(f"{where}.{key} must be a number; got {v!r}")
    if integer and (not isinstance(v, int) and not float(v).is_integer()):
        raise ScenarioError(f"{where}.{key} must be an integer; got {v!r}")
    if v != v or v in (float("inf"), float("-inf")):
        raise ScenarioError(f"{where}.{key} must be finite; got {v!r}")
    if positive and not v > 0:
        raise ScenarioError(f"{where}.{key} must be > 0; got {v!r}")
    if not positive and v < 0:
        raise ScenarioError(f"{where}.{key} must be >= 0; got {v!r}")
    return int(v) if integer else float(v)


@dataclass(frozen=True, kw_only=True)
class Region:
    name: str
    egress_usd_per_gb: float = 0.0  # price of bytes leaving this region for another one


@dataclass(frozen=True, kw_only=True)
class Link:
    a: str
    b: str
    bandwidth_gbps: float
    rtt_ms: float
    usd_per_gb: float | None = None  # region links only: overrides the sender region's egress price

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8.0

    @property
    def rtt_s(self) -> float:
        return self.rtt_ms / 1e3


@dataclass(frozen=True, kw_only=True)
class Peer:
    id: str
    region: str
    tflops: float
    memory_gb: float
    usd_per_hour: float = 0.0

    @property
    def flops(self) -> float:
        return self.tflops * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The model as the planner sees it: a per-layer profile, sequence length and dtype."""

    profile: tuple[LayerProfile, ...]
    seq_len: int
    dtype_bytes: int = 2
    # gradient bytes of weights shared by the first and last layer (tied embeddings): when they land on
    # different peers, the two exchange and sum these gradients at the end of every inner step
    tied_param_bytes: int = 0
    # recompute each block's activations in backward: a stage keeps only each layer's input per
    # microbatch in flight (plus one layer's working set), and pays one more forward (4/3 the FLOPs)
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        if len(self.profile) < 1:
            raise ScenarioError("model.profile must list at least one layer")
        if self.tied_param_bytes < 0:
            raise ScenarioError(f"model.tied_param_bytes must be >= 0; got {self.tied_param_bytes}")


@dataclass(frozen=True, kw_only=True)
class Job:
    micro_batch: int = 1  # sequences per microbatch
    micro_batches: int = 8  # microbatches per inner step (M)
    sync_every: int = DEFAULT_SYNC_EVERY  # inner steps per round (H), as a job file's sync.every
    stages: int | None = None  # fixed number of stages, or None to search
    pipelines: int | None = None  # fixed number of pipelines, or None to search
    activation_codec: str = "none"
    sync_codec: str = "none"  # pseudo-gradients between regions' leaders, and the result they forward home
    # pseudo-gradients from members to their region's leader: the runtime's ``sync.intra_codec`` (default
    # "none": fast links inside a region are not worth the codec's error), priced apart from ``sync_codec``
    sync_intra_codec: str = "none"
    overlap_sync: bool = True  # the sync engine hides the round behind the next inner steps
    # how many inner steps a round may run behind before its result is due (the runtime's ``sync.overlap``,
    # tau); None: all H of them (the ideal overlap). Ignored when ``overlap_sync`` is false.
    overlap_steps: int | None = None
    objective: Objective = field(default_factory=Objective)

    @property
    def hidden_steps(self) -> int:
        """Inner steps of compute a round can hide behind: 0 (blocking), tau, or H."""
        if not self.overlap_sync:
            return 0
        return self.sync_every if self.overlap_steps is None else min(self.overlap_steps, self.sync_every)

    def __post_init__(self) -> None:
        for name in ("micro_batch", "micro_batches", "sync_every"):
            if getattr(self, name) < 1:
                raise ScenarioError(f"job.{name} must be >= 1; got {getattr(self, name)}")
        for name in ("stages", "pipelines"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ScenarioError(f"job.{name} must be >= 1 or null (search); got {v}")
        for name in ("activation_codec", "sync_codec", "sync_intra_codec"):
            try:
                validate_codec(getattr(self, name))
            except ConfigError as e:
                raise ScenarioError(f"job.{name}: {e}") from None


@dataclass(frozen=True, kw_only=True)
class Scenario:
    regions: dict[str, Region]
    links: tuple[Link, ...]
    peers: tuple[Peer, ...]
    model: ModelSpec
    job: Job
    _index: dict[tuple[str, str], Link] = field(default_factory=dict, init=False, repr=False, compare=False)
    _peer: dict[str, Peer] = field(default_factory=dict, init=False, repr=False, compare=False)
    _has_peer_links: bool = field(default=False, init=False, repr=False, compare=False)
    _overrides: dict[str, dict[str, Link]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.peers:
            raise ScenarioError("peers is empty; list at least one peer")
        for p in self.peers:
            if p.id in self._peer:
                raise ScenarioError(f"peers: duplicate id {p.id!r}")
            if p.region not in self.regions:
                raise ScenarioError(f"peers[{p.id}].region {p.region!r} is not in regions; add it there")
            self._peer[p.id] = p
        overlap = set(self._peer) & set(self.regions)
        if overlap:
            raise ScenarioError(f"names used both as peer id and region: {sorted(overlap)}; rename one")
        explicit: dict[tuple[str, str], int] = {}
        for i, ln in enumerate(self.links):
            kinds = {"region" if x in self.regions else "peer" if x in self._peer else "?" for x in (ln.a, ln.b)}
            if "?" in kinds:
                bad = [x for x in (ln.a, ln.b) if x not in self.regions and x not in self._peer]
                raise ScenarioError(f"links[{i}]: {bad[0]!r} is neither a region nor a peer id")
            if len(kinds) != 1:
                raise ScenarioError(f"links[{i}]: a and b must both be regions or both be peer ids")
            if ln.a == ln.b and ln.a in self._peer:
                raise ScenarioError(f"links[{i}]: a peer has no link to itself; drop it")
            if (ln.a, ln.b) in explicit:
                raise ScenarioError(f"links[{i}] repeats links[{explicit[(ln.a, ln.b)]}] ({ln.a} -> {ln.b}); "
                                    "drop one (a link's reverse direction is written with a and b swapped)")
            explicit[(ln.a, ln.b)] = i
            if ln.a in self._peer:
                object.__setattr__(self, "_has_peer_links", True)
                if ln.usd_per_gb is not None:
                    raise ScenarioError(f"links[{i}]: usd_per_gb belongs on region links; drop it here")
        # a link holds both ways unless the reverse direction is listed too: then each holds for its own
        for (a, b), i in explicit.items():
            ln = self.links[i]
            self._index[(a, b)] = ln
            if (b, a) not in explicit:
                self._index[(b, a)] = ln
        for (a, b), ln in self._index.items():
            if a in self._peer:
                self._overrides.setdefault(a, {})[b] = ln

    # -- lookups ---------------------------------------------------------------------------------
    def peer(self, peer_id: str) -> Peer:
        try:
            return self._peer[peer_id]
        except KeyError:
            raise ScenarioError(f"unknown peer id {peer_id!r}") from None

    def link(self, a: str, b: str) -> Link | None:
        """The link from peer ``a`` to peer ``b`` (bytes sent a -> b): a peer-pair override, else their regions' link.

        Links are directional: ``link(a, b)`` and ``link(b, a)`` differ when the scenario lists both
        directions (a home uplink slower than its downlink, say).
        """
        ln = self._index.get((a, b))
        if ln is not None:
            return ln
        return self._index.get((self._peer[a].region, self._peer[b].region))

    def peer_overrides(self, peer_id: str) -> dict[str, Link]:
        """The peer-pair links of ``peer_id``, by the other peer's id."""
        return self._overrides.get(peer_id, {})

    def region_link(self, ra: str, rb: str) -> Link | None:
        return self._index.get((ra, rb))

    @property
    def has_peer_links(self) -> bool:
        return self._has_peer_links

    def egress_usd_per_gb(self, ra: str, rb: str) -> float:
        """Price per GB sent from region ``ra`` to region ``rb`` (0 inside a region)."""
        if ra == rb:
            return 0.0
        ln = self._index.get((ra, rb))
        if ln is not None and ln.usd_per_gb is not None:
            return ln.usd_per_gb
        return self.regions[ra].egress_usd_per_gb

    # -- parsing ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Scenario:
        """Parse and validate; raises :class:`ScenarioError` naming the bad field."""
        _take(d, "scenario", {"regions", "links", "peers", "model", "job", "name", "description"})
        raw_regions = d.get("regions")
        if not isinstance(raw_regions, Mapping) or not raw_regions:
            raise ScenarioError('regions must be a non-empty object like {"us-east": {"egress_usd_per_gb": 0.02}}')
        regions = {}
        for name, r in raw_regions.items():
            r = {} if r is None else r
            _take(r, f"regions.{name}", {"egress_usd_per_gb"})
            regions[str(name)] = Region(name=str(name), egress_usd_per_gb=_num(r, "egress_usd_per_gb", f"regions.{name}", default=0.0))
        raw_links = d.get("links", [])
        if not isinstance(raw_links, list):
            raise ScenarioError("links must be a list of {a, b, bandwidth_gbps, rtt_ms}")
        links = []
        for i, ln in enumerate(raw_links):
            w = f"links[{i}]"
            _take(ln, w, {"a", "b", "bandwidth_gbps", "rtt_ms", "usd_per_gb"})
            for k in ("a", "b"):
                if not isinstance(ln.get(k), str):
                    raise ScenarioError(f"{w}.{k} must be a region name or peer id")
            links.append(Link(a=ln["a"], b=ln["b"], bandwidth_gbps=_num(ln, "bandwidth_gbps", w, positive=True),
                              rtt_ms=_num(ln, "rtt_ms", w), usd_per_gb=_num(ln, "usd_per_gb", w, default=None)))
        raw_peers = d.get("peers")
        if not isinstance(raw_peers, list):
            raise ScenarioError("peers must be a list of {id, region, tflops, memory_gb, usd_per_hour}")
        peers = []
        for i, p in enumerate(raw_peers):
            w = f"peers[{i}]"
            _take(p, w, {"id", "region", "tflops", "memory_gb", "usd_per_hour"})
            if not isinstance(p.get("id"), str) or not p["id"]:
                raise ScenarioError(f"{w}.id must be a non-empty string")
            if not isinstance(p.get("region"), str):
                raise ScenarioError(f"{w}.region must be a region name")
            peers.append(Peer(id=p["id"], region=p["region"], tflops=_num(p, "tflops", w, positive=True),
                              memory_gb=_num(p, "memory_gb", w, positive=True),
                              usd_per_hour=_num(p, "usd_per_hour", w, default=0.0)))
        return cls(regions=regions, links=tuple(links), peers=tuple(peers),
                   model=_parse_model(d.get("model")), job=_parse_job(d.get("job", {})))


def _parse_model(m: Any) -> ModelSpec:
    if not isinstance(m, Mapping):
        raise ScenarioError("model must be an object: {layers, hidden, seq_len, vocab, dtype_bytes} or {profile, seq_len}")
    if "profile" in m:
        _take(m, "model", {"profile", "seq_len", "dtype_bytes", "tied_param_bytes", "activation_checkpointing"})
        if not isinstance(m["profile"], list) or not m["profile"]:
            raise ScenarioError("model.profile must be a non-empty list of layer objects")
        layers = []
        for i, lp in enumerate(m["profile"]):
            w = f"model.profile[{i}]"
            _take(lp, w, {"flops_per_token", "param_bytes", "activation_bytes_per_token"})
            layers.append(LayerProfile(flops_per_token=_num(lp, "flops_per_token", w),
                                       param_bytes=_num(lp, "param_bytes", w, integer=True),
                                       activation_bytes_per_token=_num(lp, "activation_bytes_per_token", w, integer=True)))
        return ModelSpec(profile=tuple(layers), seq_len=_num(m, "seq_len", "model", positive=True, integer=True),
                         dtype_bytes=_num(m, "dtype_bytes", "model", default=2, positive=True, integer=True),
                         tied_param_bytes=_num(m, "tied_param_bytes", "model", default=0, integer=True),
                         activation_checkpointing=_flag(m, "activation_checkpointing"))
    _take(m, "model", {"layers", "hidden", "seq_len", "vocab", "dtype_bytes", "name", "tie_embeddings",
                       "activation_checkpointing"})
    kw = {k: _num(m, k, "model", positive=True, integer=True) for k in ("layers", "hidden", "seq_len", "vocab")}
    dtype_bytes = _num(m, "dtype_bytes", "model", default=2, positive=True, integer=True)
    try:
        profile = transformer_profile(dtype_bytes=dtype_bytes, **kw)
    except ConfigError as e:
        raise ScenarioError(str(e)) from None
    tie = m.get("tie_embeddings", False)
    if not isinstance(tie, bool):
        raise ScenarioError("model.tie_embeddings must be true or false")
    tied = kw["vocab"] * kw["hidden"] * dtype_bytes if tie else 0
    return ModelSpec(profile=tuple(profile), seq_len=kw["seq_len"], dtype_bytes=dtype_bytes, tied_param_bytes=tied,
                     activation_checkpointing=_flag(m, "activation_checkpointing"))


def _flag(m: Mapping[str, Any], key: str) -> bool:
    v = m.get(key, False)
    if not isinstance(v, bool):
        raise ScenarioError(f"model.{key} must be true or false; got {v!r}")
    return v


def _parse_job(j: Any) -> Job:
    j = {} if j is None else j
    _take(j, "job", {"micro_batch", "micro_batches", "sync_every", "stages", "pipelines",
                     "activation_codec", "sync_codec", "sync_intra_codec", "overlap_sync", "overlap_steps",
                     "objective"})
    kw: dict[str, Any] = {}
    for k in ("micro_batch", "micro_batches", "sync_every", "stages", "pipelines"):
        if j.get(k) is not None:
            kw[k] = _num(j, k, "job", positive=True, integer=True)
    for k in ("activation_codec", "sync_codec", "sync_intra_codec"):
        if k in j:
            if not isinstance(j[k], str):
                raise ScenarioError(f"job.{k} must be a codec name like 'int8'; got {j[k]!r}")
            kw[k] = j[k]
    if "overlap_sync" in j:
        if not isinstance(j["overlap_sync"], bool):
            raise ScenarioError("job.overlap_sync must be true or false")
        kw["overlap_sync"] = j["overlap_sync"]
    if j.get("overlap_steps") is not None:
        v = j["overlap_steps"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ScenarioError(f"job.overlap_steps must be an integer >= 0 (inner steps a round may run behind); got {v!r}")
        kw["overlap_steps"] = v
    try:
        kw["objective"] = Objective.parse(j.get("objective"))
    except ConfigError as e:
        raise ScenarioError(f"job.objective: {e}") from None
    return Job(**kw)
