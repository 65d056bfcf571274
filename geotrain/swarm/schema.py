"""The validators every geotrain DHT node runs, in hivemind's order.

hivemind combines record validators in a ``CompositeValidator`` sorted by
``priority``: it *signs* in increasing priority and *validates* (then strips) in
decreasing priority. We run three:

====================  ========  =====================================================
validator             priority  checks
====================  ========  =====================================================
LimitsValidator       20        size, nesting depth (scanned, not decoded), lifetime
RSASignatureValidator 10        owner-keyed subkeys carry the owner's signature
SchemaValidator       0         the decoded value matches the record's schema
====================  ========  =====================================================

So an oversized, over-nested or pinned (far-future) record is refused before
anything decodes it, a forged one before its schema is looked at, and only then
is the value decoded and checked for types. hivemind calls ``validate`` when a
peer asks us to store a record and when a peer returns one to our ``get``.

The pydantic v1 schema hivemind needs is derived mechanically from the v2
models in :mod:`geotrain.swarm.records`, so the two cannot drift apart.
"""

from __future__ import annotations

import enum
import logging
import types
import typing
from typing import Any, Union

import pydantic.v1 as v1
from pydantic import BaseModel, JsonValue

from geotrain.errors import RecordError
from geotrain.swarm.msgpack_guard import scan_msgpack, strip_signatures
from geotrain.swarm.records import ADDED_FIELDS, MODEL_OF_KIND

logger = logging.getLogger(__name__)

#: hivemind allows this much clock disagreement between DHT nodes (MAX_DHT_TIME_DISCREPANCY_SECONDS)
CLOCK_SLACK_S = 3.0


class LimitsValidator:
    """Refuses DHT records that are too large, too deeply nested, or pinned too far ahead.

    Applies to every record this node stores or reads, whatever its key: a
    swarm's DHT carries only what its members agreed on. The scan is
    :func:`~geotrain.swarm.msgpack_guard.scan_msgpack`: no decoding, no recursion.

    It implements hivemind's ``RecordValidatorBase`` interface by duck typing
    (``CompositeValidator`` only calls these methods), so importing this module
    does not import hivemind, and with it torch.
    """

    def __init__(self, *, max_value_bytes: int, max_depth: int, max_ttl_s: float) -> None:
        self.max_value_bytes = max_value_bytes
        self.max_depth = max_depth
        self.max_ttl_s = max_ttl_s
        self.refused = 0  # counted in the process that validates (the DHT process)

    def check(self, key: bytes, subkey: bytes, value: bytes, expiration_time: float, now: float) -> None:
        """Raise :class:`RecordError` naming the first limit the record breaks."""
        if expiration_time > now + self.max_ttl_s + CLOCK_SLACK_S:
            raise RecordError(
                f"record expires {expiration_time - now:.0f}s from now; the swarm caps lifetimes at {self.max_ttl_s:.0f}s"
            )
        if len(value) + len(subkey) > self.max_value_bytes:
            raise RecordError(
                f"record of {len(value) + len(subkey)} bytes exceeds {self.max_value_bytes} bytes"
            )
        # Scan exactly the bytes the schema validator and the reader will decode: the value
        # with every "[signature:...]" removed, as RSASignatureValidator.strip_value does.
        scan_msgpack(strip_signatures(value), max_depth=self.max_depth)
        if subkey:
            scan_msgpack(subkey, max_depth=self.max_depth)

    def validate(self, record: Any) -> bool:
        from hivemind.utils.timed_storage import get_dht_time

        try:
            self.check(record.key, record.subkey, record.value, record.expiration_time, get_dht_time())
        except RecordError as e:
            self.refused += 1
            logger.debug("refused a DHT record: %s", e)
            return False
        return True

    def sign_value(self, record: Any) -> bytes:
        return bytes(record.value)  # nothing to add: limits are checked, not signed

    def strip_value(self, record: Any) -> bytes:
        return bytes(record.value)

    @property
    def priority(self) -> int:
        return 20  # above RSASignatureValidator (10): runs first on validation

    def merge_with(self, other: Any) -> bool:
        return False


# -- pydantic v2 model -> pydantic v1 schema -----------------------------------------------------
_V1_CACHE: dict[tuple[type, tuple[str, ...]], type] = {}


def v1_type(annotation: Any) -> Any:
    """The strict pydantic v1 type matching a v2 annotation (constraints are left to v2)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return v1_type(typing.get_args(annotation)[0])
    if annotation is JsonValue or annotation is Any:
        return Any
    if annotation is str:
        return v1.StrictStr
    if annotation is bool:
        return v1.StrictBool
    if annotation is int:
        return v1.StrictInt
    if annotation is float:
        return v1.StrictFloat
    if annotation is type(None):
        return type(None)
    if origin in (Union, types.UnionType):
        args = tuple(v1_type(a) for a in typing.get_args(annotation))
        return Union[args]  # noqa: UP007 (a runtime-built Union)
    if origin is dict:
        k, v = typing.get_args(annotation)
        return dict[v1_type(k), v1_type(v)]  # type: ignore[misc]
    if origin is list:
        (item,) = typing.get_args(annotation)
        return list[v1_type(item)]  # type: ignore[misc]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return v1_model(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation  # v1 checks the value is one of its members' values
    raise TypeError(f"no pydantic v1 equivalent for {annotation!r}; extend geotrain.swarm.schema.v1_type")


def v1_model(model: type[BaseModel], *, without: tuple[str, ...] = ()) -> type:
    """A pydantic v1 model with the same fields as ``model`` (less ``without``), every field required,
    extras refused."""
    key = (model, without)
    if key not in _V1_CACHE:
        fields = {name: (v1_type(f.annotation), ...) for name, f in model.model_fields.items() if name not in without}

        class Config:
            extra = v1.Extra.forbid

        name = f"{model.__name__}{'Legacy' if without else ''}Schema"
        _V1_CACHE[key] = v1.create_model(name, __config__=Config, **fields)  # type: ignore[call-overload]
    return _V1_CACHE[key]


def swarm_schema(*, legacy: bool | int = False) -> type:
    """The v1 model hivemind's SchemaValidator enforces: one field per record kind,
    each a dict from owner-keyed subkeys to that kind's record.

    ``legacy``: the records as older geotrain versions write them (without
    :data:`~geotrain.swarm.records.ADDED_FIELDS`); a node accepts every shape. ``True`` drops every added
    field; an int ``k`` drops each kind's last ``k`` added fields (fields are added in that order, so a
    version between two additions writes the earlier ones only).
    """
    from hivemind.dht.schema import BytesWithPublicKey

    def dropped(kind: str) -> tuple[str, ...]:
        added = ADDED_FIELDS.get(kind, ())
        if legacy is True or (legacy is not False and legacy >= len(added)):
            return added
        return added[len(added) - int(legacy):] if legacy else ()

    fields: dict[str, Any] = {
        kind: (dict[BytesWithPublicKey, v1_model(model, without=dropped(kind))], None)  # type: ignore[misc]
        for kind, model in MODEL_OF_KIND.items()
    }
    name = "SwarmSchema" if legacy is False else "SwarmLegacySchema" if legacy is True else f"SwarmLegacy{legacy}Schema"
    return v1.create_model(name, **fields)


def build_validators(
    *, swarm: str, private_key: Any, max_value_bytes: int, max_depth: int, max_ttl_s: float
) -> list[Any]:
    """The three validators of a geotrain DHT node (see the module docstring for their order)."""
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.dht.schema import SchemaValidator

    schema = SchemaValidator(swarm_schema(), allow_extra_keys=True, prefix=swarm)
    # a record from an older peer (without the fields added since) matches one of the legacy schemas
    for k in range(1, max((len(a) for a in ADDED_FIELDS.values()), default=0) + 1):
        schema.merge_with(SchemaValidator(swarm_schema(legacy=k), allow_extra_keys=True, prefix=swarm))
    return [
        LimitsValidator(max_value_bytes=max_value_bytes, max_depth=max_depth, max_ttl_s=max_ttl_s),
        RSASignatureValidator(private_key),
        schema,
    ]


def dht_key(swarm: str, kind: str) -> str:
    """The DHT key of one kind of record in one swarm (what SchemaValidator's ``prefix`` produces)."""
    if kind not in MODEL_OF_KIND:
        raise ValueError(f"unknown record kind {kind!r}; one of {sorted(MODEL_OF_KIND)}")
    return f"{swarm}_{kind}"
