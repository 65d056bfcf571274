"""Pseudo-gradient payloads on the data plane: encode once (with error feedback), ship the bytes as-is.

Why not hand the tensor to ``Transport.send(codec=...)``? Error feedback needs
the exact value the receiver will decode, so the sender encodes once, keeps
``residual = input - decode(encoding)``, and sends that very encoding: its
buffers travel as lossless frames, its codec spec and meta in the message
meta. The receiver decodes with the spec it names, which validates meta and
byte lengths before allocating (the peer is untrusted).

What is the *residual*? The part of a payload the codec dropped, kept by the
sender per fragment (one flat vector, sliced like the payload) and added to
the next payload from the same position (Seide et al. 2014; Karimireddy et al. 2019).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from geotrain.compression import get_codec
from geotrain.errors import BadContributionError, CodecError

__all__ = ["CARRIER", "encode_payload", "decode_payload"]

#: How the encoded buffers travel: raw bytes, NaN passed through (the receiver checks values itself).
CARRIER = "none:allow_nonfinite=true"


def encode_payload(
    value: torch.Tensor, spec: str, *, prefix: str, residual: torch.Tensor | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor], torch.Tensor]:
    """Encode ``value`` ``(N,)`` for the wire; returns (meta entry, tensors, decoded value).

    With ``residual`` (same shape, updated in place) the encoded input is ``value + residual``.
    """
    x = value if residual is None else value + residual
    codec = get_codec(spec)
    enc = codec.encode(x)
    decoded = codec.decode(enc.meta, enc.buffers).reshape(-1).float()  # (N,) what the receiver will see
    if residual is not None:
        residual.copy_(x - decoded)
    tensors = {f"{prefix}.{i}": b for i, b in enumerate(enc.buffers)}
    return {"codec": enc.codec, "meta": enc.meta, "nbuf": len(enc.buffers)}, tensors, decoded


def decode_payload(entry: Any, tensors: Mapping[str, torch.Tensor], *, prefix: str, sender: str, numel: int) -> torch.Tensor:
    """Decode one payload of a received message into ``(numel,)`` fp32; BadContributionError if malformed."""
    try:
        if not isinstance(entry, dict) or not isinstance(entry.get("codec"), str) or type(entry.get("nbuf")) is not int:
            raise CodecError("payload entry must be a map with 'codec' and 'nbuf'")
        nbuf = entry["nbuf"]
        if not 0 < nbuf <= 16:
            raise CodecError(f"payload has {nbuf} buffers; expected 1..16")
        buffers = []
        for i in range(nbuf):
            t = tensors.get(f"{prefix}.{i}")
            if t is None:
                raise CodecError(f"payload buffer {prefix}.{i} missing")
            buffers.append(t)
        meta = entry.get("meta")
        if not isinstance(meta, dict):
            raise CodecError("payload meta must be a map")
        shape = meta.get("shape")
        if not isinstance(shape, list) or [int(d) for d in shape if isinstance(d, int)] != shape:
            raise CodecError("payload shape must be a list of ints")
        count = 1
        for d in shape:
            count *= d
        if count != numel:  # before decoding: never allocate what we did not ask for
            raise CodecError(f"payload of {count} elements; this round expects {numel}")
        out = get_codec(entry["codec"]).decode(meta, buffers)
    except (CodecError, ValueError) as e:
        raise BadContributionError(f"malformed payload from {sender}: {e}", sender=sender) from None
    return out.reshape(-1).float()
