"""Swarm-key admission: who is a member, proven in DHT records, enforced by CURVE + ZAP on the data plane.

What is a member? A process holding the swarm key (``geotrain keygen``). Each
member makes a fresh CURVE key pair at start and publishes its public key in
its signed peer record (the coordinator in its signed job record) together
with an *admission proof*: HMAC-SHA256 under the swarm key over the record
owner's peer id and that CURVE key. Only a key holder can make a proof, and a
proof names one owner, so copying a member's proof into another peer's record
does not verify (records are signed by their owner).

Every member:

- ignores DHT records (peers, links, progress, jobs, plans) whose owner has no valid proof;
- serves its data plane with CURVE (authenticated, encrypted) and a ZAP
  allow-list of the verified members' CURVE keys: anyone else is refused at
  the handshake, before a single message is read.

Without a swarm key the swarm is open (documented in docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac

import zmq

from geotrain.transport import CurveConfig

_DOMAIN = b"geotrain-admission-v1\0"


class Admission:
    """One process's admission material: the swarm key and this process's CURVE key pair."""

    def __init__(self, swarm_key: bytes) -> None:
        if len(swarm_key) < 16:
            raise ValueError("a swarm key must hold at least 16 bytes; make one with `geotrain keygen`")
        self._key = swarm_key
        public, secret = zmq.curve_keypair()
        self.curve_public_key: str = public.decode()
        self._secret = secret

    def proof(self, owner: str, curve_public_key: str) -> str:
        msg = _DOMAIN + owner.encode() + b"\0" + curve_public_key.encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def own_proof(self, owner: str) -> str:
        return self.proof(owner, self.curve_public_key)

    def verify(self, owner: str, curve_public_key: str | None, proof: str | None) -> bool:
        if not curve_public_key or not proof:
            return False
        return hmac.compare_digest(self.proof(owner, curve_public_key), proof)

    def curve_config(self, allowed: frozenset[bytes] = frozenset()) -> CurveConfig:
        return CurveConfig(
            public_key=self.curve_public_key.encode(), secret_key=self._secret, allowed_clients=allowed
        )
