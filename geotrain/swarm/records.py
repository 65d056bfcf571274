"""Typed records that peers and the coordinator publish on the DHT.

Every record lives under one swarm-prefixed DHT key (``<swarm>_peers``,
``<swarm>_links``, ...) in a subkey that holds its owner's public key, so
hivemind's ``RSASignatureValidator`` only accepts it when signed by that owner.
One owner therefore has at most one live record of each kind; republishing
replaces it.

These pydantic (v2) models are the public, typed view. They are strict: no
type coercion, unknown fields refused, numbers bounded where a bound is
meaningful. :mod:`geotrain.swarm.schema` derives from them the pydantic v1
schema that hivemind's ``SchemaValidator`` enforces on every DHT node.

Words: a **heartbeat** is a republication of a peer record; its DHT expiration
is 3 heartbeat periods and an RPC timeout, so a dead peer's record vanishes
within that time.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    field_validator,
    model_validator,
)

#: Kinds of record, and the DHT key suffix each lives under.
RECORD_KINDS = ("peers", "links", "job", "plan", "progress", "digest")

_REGION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENDPOINT_RE = re.compile(r"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}$")
#: the endpoint of a peer that accepts no inbound connections (geotrain.transport.addresses.DIAL_BACK)
DIAL_BACK = "dialback://"

PeerIdStr = Annotated[str, Field(min_length=1, max_length=128)]
Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0)]
# Finite only: hivemind's SchemaValidator compares values with ==, and NaN != NaN would refuse them anyway.
Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    def to_wire(self) -> dict[str, JsonValue]:
        """The msgpack-able dict stored in the DHT (floats stay floats, absent optionals are None)."""
        return self.model_dump(mode="python")


class PeerRecord(_Record):
    """What a peer offers: published at start and refreshed by its heartbeat.

    ``flops`` is measured (FLOP/s from a short fp32 matmul benchmark), not declared; ``flops_bf16``
    is the same benchmark in bf16 (None from an older peer), what the planner uses for a bf16 job.
    ``endpoint`` is the peer's ZMQ data-plane address ``tcp://host:port``, the one
    others dial; ``dialback://`` for a peer behind NAT, which dials out to the peers
    it exchanges with (never dial such a peer).
    ``endpoints`` are all the addresses it advertises (``--announce``, or its interfaces'
    addresses when bound to ``0.0.0.0``), ``endpoint`` first; never an unspecified address.
    ``reachable`` is the reachability preflight's verdict (:mod:`geotrain.peers.reachability`):
    True = another peer dialled its endpoints back, False = it could not (the peer dials out
    instead), None = not checked yet (no other peer to ask).
    ``curve_public_key`` is its Z85 CURVE key when the swarm uses encryption.
    ``started_at`` / ``heartbeat_at`` are DHT times (seconds since the epoch).
    ``endpoints`` and ``reachable`` are newer than the other fields: a record without them
    (from an older geotrain) still decodes, as ``[]`` and None.
    """

    peer_id: PeerIdStr
    region: str
    device: Annotated[str, Field(min_length=1, max_length=128)]
    flops: NonNegative
    memory_bytes: Count
    usd_per_hour: NonNegative
    endpoint: Annotated[str, Field(max_length=300)]
    version: Annotated[str, Field(min_length=1, max_length=64)]
    curve_public_key: Annotated[str, Field(min_length=40, max_length=40)] | None = None
    admission: Annotated[str, Field(min_length=64, max_length=64)] | None = None  # swarm-key proof (hex)
    started_at: Seconds
    heartbeat_at: Seconds
    endpoints: Annotated[list[Annotated[str, Field(max_length=300)]], Field(max_length=16)] = Field(
        default_factory=list
    )
    reachable: bool | None = None
    flops_bf16: NonNegative | None = None  # the same benchmark in bf16 (what a bf16 job's planner uses)

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if not _REGION_RE.match(v):
            raise ValueError(
                f"region {v!r} must be 1-64 chars of letters, digits, '.', '_' or '-' (e.g. eu-west)"
            )
        return v

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v != DIAL_BACK and not _ENDPOINT_RE.match(v):
            raise ValueError(f"endpoint {v!r} must look like tcp://HOST:PORT (or {DIAL_BACK})")
        return v

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, v: list[str]) -> list[str]:
        for e in v:
            if not _ENDPOINT_RE.match(e):
                raise ValueError(f"advertised endpoint {e!r} must look like tcp://HOST:PORT")
            host = e[len("tcp://"):].rpartition(":")[0].strip("[]")
            if host in ("0.0.0.0", "::", "*"):
                raise ValueError(f"advertised endpoint {e!r} is unspecified: nobody can dial it")
        return v

    @property
    def dial_back(self) -> bool:
        """True for a peer others must not dial: it dials out, and is answered on its own connection."""
        return self.endpoint == DIAL_BACK


class LinkMeasurement(_Record):
    """One measured link from the row's source to one destination peer."""

    bandwidth_bps: NonNegative  # bytes per second
    rtt_s: Seconds
    measured_at: Seconds


class LinkRow(_Record):
    """A peer's row of the link matrix: its measured links to the peers it probed."""

    src: PeerIdStr
    links: Annotated[dict[str, LinkMeasurement], Field(max_length=4096)]


class JobRecord(_Record):
    """The job the coordinator publishes: ``spec`` is the JSON form of the job config."""

    job_id: Annotated[str, Field(min_length=1, max_length=128)]
    spec: dict[str, JsonValue]
    published_at: Seconds
    curve_public_key: Annotated[str, Field(min_length=40, max_length=40)] | None = None  # the coordinator's
    admission: Annotated[str, Field(min_length=64, max_length=64)] | None = None  # swarm-key proof (hex)
    # the coordinator's data-plane address: peers send it news (geotrain.swarm.news) there
    endpoint: Annotated[str, Field(max_length=300)] | None = None
    # the plan's version pointer: the newest plan's version and stop step. A reader reads the (O(N)) plan
    # record only when these moved (or news said so); None from an older coordinator: read it every time
    plan_version: Annotated[int, Field(ge=1)] | None = None
    plan_stop_step: Annotated[int, Field(ge=0)] | None = None

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and v != DIAL_BACK and not _ENDPOINT_RE.match(v):
            raise ValueError(f"endpoint {v!r} must look like tcp://HOST:PORT")
        return v


class PlanRecord(_Record):
    """A versioned plan: ``plan`` is the JSON form of the planner's output for ``job_id``."""

    job_id: Annotated[str, Field(min_length=1, max_length=128)]
    version: Annotated[int, Field(ge=1)]
    plan: dict[str, JsonValue]
    published_at: Seconds


class PeerStatus(str, Enum):  # noqa: UP042 (StrEnum needs Python 3.11; geotrain supports 3.10)
    """Where a peer stands in the job it follows: the ``status`` of its progress record.

    - ``idle``: following a job whose plan has not placed it yet (a joiner, or a peer between jobs);
    - ``joining``: a plan placed it; it is building its stage (fetching state, connecting its neighbours);
    - ``training``: running inner steps of its stage under the current plan;
    - ``stalled``: an inner step failed (a neighbour died or timed out); waiting for a newer plan;
    - ``done``: reached the plan's stop step and wrote its final state;
    - ``spare``: alive and measured, but the current plan gives it no stage;
    - ``left``: the peer is leaving the job (one of its local ranks died): plan around it at once. A node
      of an older version refuses the record, which reads as the peer being gone: the same outcome.
    """

    IDLE = "idle"
    JOINING = "joining"
    TRAINING = "training"
    STALLED = "stalled"
    DONE = "done"
    SPARE = "spare"
    LEFT = "left"


def _as_status(v: Any) -> Any:
    # on the wire a status is its plain string; strict validation takes only members
    return PeerStatus(v) if isinstance(v, str) and not isinstance(v, PeerStatus) else v


#: A status field: a member in Python, its plain string on the wire (msgpack and the v1 schema)
Status = Annotated[PeerStatus, BeforeValidator(_as_status), PlainSerializer(lambda s: s.value, return_type=str)]

#: The float codes older peers wrote in ``ProgressRecord.stats["status"]``: decoded, never written.
LEGACY_STATUS_CODES: dict[float, PeerStatus] = {
    0.0: PeerStatus.TRAINING, 1.0: PeerStatus.STALLED, 2.0: PeerStatus.DONE, 3.0: PeerStatus.SPARE,
    4.0: PeerStatus.IDLE,
}


class ShardReport(_Record):
    """One peer-held checkpoint shard (:mod:`geotrain.peers.statestore`): blocks ``[start, end)`` as of
    checkpoint step ``step`` (after ``round`` rounds), and the SHA-256 of its file."""

    round: Count
    step: Count
    start: Count
    end: Count
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]

    @model_validator(mode="after")
    def _blocks(self) -> ShardReport:
        if self.start >= self.end:
            raise ValueError(f"a shard holds blocks [start, end) with start < end; got [{self.start}, {self.end})")
        return self


class InboundLinkReport(_Record):
    """A link into the reporting peer as its real traffic measured it (:mod:`geotrain.transport.linkmeter`)."""

    bandwidth_bps: NonNegative  # bytes per second, from the messages the link held
    messages: Count  # stamped messages of the window
    queued: Count  # of them, those the link held (20 ms or more beyond the sender's quickest transit)


class ProgressRecord(_Record):
    """One peer's training progress, republished as it goes.

    ``status`` is the peer's :class:`PeerStatus`; ``round`` counts outer steps;
    ``bytes_sent``/``bytes_received`` are data-plane totals; ``stats`` holds any
    further numeric figures (utilization, tokens/s, ...). A record of an older
    peer carries its status as a float code in ``stats["status"]`` instead (see
    :data:`LEGACY_STATUS_CODES`): it decodes to the same typed ``status``.
    ``shards`` are the checkpoint shards the peer holds on its disk (the coordinator's manifests list
    them); an older peer wrote each as a ``stats`` key ``shard:<round>:<step>:<start>-<end>:<sha256>``,
    decoded into ``shards`` the same way.
    """

    peer_id: PeerIdStr
    job_id: Annotated[str, Field(min_length=1, max_length=128)]
    plan_version: Count
    step: Count
    loss: Finite | None = None  # None when the peer has no loss yet (or it was not finite)
    tokens: Count
    round: Count
    bytes_sent: Count
    bytes_received: Count
    updated_at: Seconds
    stats: Annotated[dict[str, Finite], Field(max_length=64)] = Field(default_factory=dict)
    status: Status = PeerStatus.IDLE
    shards: Annotated[list[ShardReport], Field(max_length=16)] = Field(default_factory=list)
    # senders whose messages their link into this peer held (a link that limits the pipeline), by peer id
    links_in: Annotated[dict[PeerIdStr, InboundLinkReport], Field(max_length=8)] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _legacy_shards(cls, data: Any) -> Any:
        """An older peer's record: its shards are ``shard:...`` keys in ``stats``; move them to ``shards``."""
        if not isinstance(data, dict) or "shards" in data or not isinstance(data.get("stats"), dict):
            return data
        stats = data["stats"]
        wires = [k[len("shard:"):] for k in stats if isinstance(k, str) and k.startswith("shard:")]
        if not wires:
            return data
        shards = []
        for w in wires:
            parts = w.split(":")
            blocks = parts[2].split("-") if len(parts) == 4 else []
            if len(blocks) != 2 or not all(x.isdigit() for x in (parts[0], parts[1], *blocks)):
                raise ValueError(f"stats key shard:{w} is not shard:<round>:<step>:<start>-<end>:<sha256>")
            shards.append({"round": int(parts[0]), "step": int(parts[1]), "start": int(blocks[0]),
                           "end": int(blocks[1]), "sha256": parts[3]})
        rest = {k: v for k, v in stats.items() if not (isinstance(k, str) and k.startswith("shard:"))}
        return {**data, "stats": rest, "shards": shards}

    @model_validator(mode="before")
    @classmethod
    def _legacy_status(cls, data: Any) -> Any:
        """An older peer's record: its status is a float code in ``stats``; move it to the typed field."""
        if not isinstance(data, dict) or "status" in data:
            return data
        stats = data.get("stats")
        if not isinstance(stats, dict) or "status" not in stats:
            return data
        code = stats["status"]
        if code not in LEGACY_STATUS_CODES:
            raise ValueError(f"stats.status {code!r} is no status code (one of {sorted(LEGACY_STATUS_CODES)})")
        rest = {k: v for k, v in stats.items() if k != "status"}
        return {**data, "stats": rest, "status": LEGACY_STATUS_CODES[code]}



class MemberProgress(_Record):
    """One member's line of a :class:`RegionDigest`: what the coordinator's watch needs each tick.

    ``updated_at`` is the time of the member's progress record it summarises, ``shard_step`` the step of the
    newest checkpoint shard the member holds (None: none), ``links`` how many of its inbound links its traffic
    found limiting, ``lost`` whether it reports blocks nobody holds. The shards, links and statistics
    themselves stay in the member's own :class:`ProgressRecord`, which the coordinator reads when one of
    these moved.
    """

    plan_version: Count
    step: Count
    round: Count
    tokens: Count
    loss: Finite | None = None
    status: Status
    updated_at: Seconds
    shard_step: Count | None = None
    links: Count = 0
    lost: bool = False



class RegionDigest(_Record):
    """The progress of one region's plan peers and spares, published by the region's collector (the plan's
    first peer in that region, :meth:`geotrain.plan.JobPlan.collector`) once per liveness period.

    Members send the collector their line over the data plane; the coordinator reads one digest per region
    instead of every peer's progress record (O(regions) records per tick, about 130 bytes per member against
    1.5 KB and a signature). It is a hint: a member's own progress record stays the truth for its liveness
    (docs/swarm.md, "Progress digests").
    """

    collector: PeerIdStr
    job_id: Annotated[str, Field(min_length=1, max_length=128)]
    plan_version: Count
    region: str
    updated_at: Seconds
    members: Annotated[dict[PeerIdStr, MemberProgress], Field(max_length=2048)]

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if not _REGION_RE.match(v):
            raise ValueError(f"region {v!r} must be 1-64 chars of letters, digits, '.', '_' or '-'")
        return v



#: Fields added to a kind after its first release: records without them (older peers) stay valid.
ADDED_FIELDS: dict[str, tuple[str, ...]] = {"peers": ("endpoints", "reachable", "flops_bf16"),
                                            "job": ("plan_version", "plan_stop_step"),
                                            "progress": ("status", "shards", "links_in")}

#: The model stored under each kind of key.
MODEL_OF_KIND: dict[str, type[_Record]] = {
    "peers": PeerRecord,
    "links": LinkRow,
    "job": JobRecord,
    "plan": PlanRecord,
    "progress": ProgressRecord,
    "digest": RegionDigest,
}
