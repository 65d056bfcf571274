"""A peer's identity: one RSA key pair kept in one file, reused across restarts.

What is an identity? The key pair that names a peer. Its file is hivemind's
libp2p identity format (a protobuf ``PrivateKey{type=RSA, data=PKCS#1 DER}``),
so the same file serves two purposes:

- ``p2pd`` loads it (hivemind's ``identity_path``), so the libp2p peer id is
  stable: a restarted peer is reachable at the same ``/p2p/<peer id>``;
- geotrain loads the same RSA key into hivemind's ``RSASignatureValidator``, so
  the records a peer signs keep the same owner after a restart.

The **peer id** geotrain uses everywhere is that libp2p peer id (base58, e.g.
``QmT...``). It is derived from the public key alone, so anyone holding an owner
public key from a record's subkey can recompute it (:func:`peer_id_from_public_key`):
a record cannot claim another peer's id.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from geotrain.errors import ConfigError

if TYPE_CHECKING:
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.utils.crypto import RSAPrivateKey

logger = logging.getLogger(__name__)

KEY_BITS = 2048


@dataclass(frozen=True, kw_only=True)
class Identity:
    """A loaded identity. ``path`` is None for an ephemeral one (never written to disk)."""

    path: Path | None
    private_key_der: bytes  # PKCS#1 DER of the RSA private key
    peer_id: str  # libp2p peer id, base58

    def __post_init__(self) -> None:
        if not self.private_key_der:
            raise ConfigError("identity has an empty private key; delete the file to generate a new one")

    def __repr__(self) -> str:  # never show key material in logs
        return f"Identity(peer_id={self.peer_id!r}, path={self.path!r})"

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Identity:
        """Load the identity at ``path``; create it (mode 0600) if the file does not exist."""
        p = Path(path)
        if not p.exists():
            if not p.parent.is_dir():
                raise ConfigError(
                    f"identity directory {p.parent} does not exist; create it or pick another --identity"
                )
            der = _generate_der()
            _write_private(p, _wrap_protobuf(der))
            logger.info("created a new identity at %s", p)
        try:
            der = _unwrap_protobuf(p.read_bytes())
        except (ValueError, TypeError) as e:
            raise ConfigError(
                f"{p} is not a geotrain/hivemind identity file ({e}); move it away to generate a new one"
            ) from e
        mode = p.stat().st_mode & 0o077
        if mode:
            logger.warning(
                "identity file %s is readable by others (mode %o); chmod 600 it", p, p.stat().st_mode & 0o777
            )
        return cls(path=p, private_key_der=der, peer_id=_peer_id_from_der(der))

    @classmethod
    def ephemeral(cls) -> Identity:
        """A fresh identity held only in memory (the process gets a new peer id each run)."""
        der = _generate_der()
        return cls(path=None, private_key_der=der, peer_id=_peer_id_from_der(der))

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write this identity to a new file (mode 0600); refuses to overwrite."""
        p = Path(path)
        _write_private(p, _wrap_protobuf(self.private_key_der))
        return p

    def hivemind_private_key(self) -> RSAPrivateKey:
        """This key as hivemind's ``RSAPrivateKey`` (what ``RSASignatureValidator`` accepts)."""
        from hivemind.utils.crypto import RSAPrivateKey

        key = RSAPrivateKey.__new__(RSAPrivateKey)
        # hivemind restores keys from DER through __setstate__ (its pickling hook); we reuse that
        # entry point instead of generating a throwaway key in __init__.
        key.__setstate__({"_private_key": self.private_key_der})
        return key

    def signature_validator(self) -> RSASignatureValidator:
        from hivemind.dht.crypto import RSASignatureValidator

        return RSASignatureValidator(self.hivemind_private_key())

    def owner_public_key(self) -> bytes:
        """The OpenSSH public key bytes hivemind puts in ``[owner:...]`` subkeys."""
        return self.hivemind_private_key().get_public_key().to_bytes()


def peer_id_from_public_key(openssh_public_key: bytes) -> str:
    """libp2p peer id (base58) of an RSA public key in OpenSSH form (as found in owner subkeys)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = serialization.load_ssh_public_key(openssh_public_key)
    if not isinstance(key, rsa.RSAPublicKey):
        raise ValueError("owner key is not an RSA public key")
    return _peer_id_from_spki(
        key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


# -- file format and id derivation -------------------------------------------------------------
def _generate_der() -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
    return key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _wrap_protobuf(der: bytes) -> bytes:
    from hivemind.proto import crypto_pb2

    return bytes(crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=der).SerializeToString())


def _unwrap_protobuf(data: bytes) -> bytes:
    from google.protobuf.message import DecodeError
    from hivemind.proto import crypto_pb2

    try:
        msg = crypto_pb2.PrivateKey.FromString(data)
    except DecodeError as e:
        raise ValueError(f"not a protobuf PrivateKey: {e}") from e
    if msg.key_type != crypto_pb2.KeyType.RSA:
        raise ValueError(f"key type {msg.key_type} is not RSA")
    from cryptography.hazmat.primitives import serialization

    serialization.load_der_private_key(msg.data, password=None)  # raises ValueError if corrupt
    return bytes(msg.data)


def _peer_id_from_der(der: bytes) -> str:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_der_private_key(der, password=None)
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _peer_id_from_spki(spki)


def _peer_id_from_spki(spki: bytes) -> str:
    # libp2p peer id spec: multihash(sha2-256, protobuf PublicKey{RSA, SPKI DER}), base58.
    # Same derivation as hivemind's PeerID.from_identity, so ids match p2pd's.
    from hivemind.p2p import PeerID
    from hivemind.proto import crypto_pb2

    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=spki).SerializeToString()
    multihash = bytes([0x12, 0x20]) + hashlib.sha256(encoded).digest()
    return str(PeerID(multihash).to_base58())


def _write_private(path: Path, data: bytes) -> None:
    # O_EXCL: never clobber an existing identity; 0600 from creation, no window where it is world-readable.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
