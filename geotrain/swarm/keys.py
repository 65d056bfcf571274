"""The swarm key: one shared 32-byte secret that admits members (CURVE admission on the data plane).

The file holds the key as one line of Z85 text (40 characters, the encoding
ZeroMQ uses for CURVE keys) and is created with mode 0600. Whoever holds it is
a member; hand it out like a password.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from geotrain.errors import ConfigError

SWARM_KEY_BYTES = 32


def generate_swarm_key(path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write a fresh random swarm key to ``path`` (mode 0600). Refuses to overwrite unless asked."""
    import zmq.utils.z85 as z85

    p = Path(path)
    if p.exists() and not overwrite:
        raise ConfigError(f"{p} exists; pass --force to replace it (members holding the old key lose access)")
    if p.exists():
        p.unlink()
    text = z85.encode(secrets.token_bytes(SWARM_KEY_BYTES)) + b"\n"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text)
    finally:
        os.close(fd)
    return p


def load_swarm_key(path: str | os.PathLike[str]) -> bytes:
    """The 32 secret bytes in a swarm key file."""
    import zmq.utils.z85 as z85

    p = Path(path)
    try:
        text = p.read_bytes().strip()
    except OSError as e:
        raise ConfigError(f"cannot read swarm key {p}: {e}; create one with `geotrain keygen {p}`") from e
    if len(text) != 40:
        raise ConfigError(
            f"{p} is not a swarm key (expected 40 Z85 characters); create one with `geotrain keygen`"
        )
    try:
        key = bytes(z85.decode(text))
    except (ValueError, KeyError) as e:
        raise ConfigError(f"{p} is not a swarm key ({e})") from e
    return key
