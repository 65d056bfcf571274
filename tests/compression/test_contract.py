"""The codec contract, run against every registered codec (and a few option variants).

Error bounds checked here (documented in docs/compression.md):

- ``none``: exact; ``fp16``/``bf16``: one rounding of the wire dtype.
- ``int8``: ``max|x in block| / 254``; ``int4`` (int grid): ``/ 14``; ``int4`` (e2m1): ``/ 6``.
- ``topk``: exactly the top-k positions of each chunk survive; kept values within ``max|kept| / 254``.
- ``hivemind-*``: relative L2 error on normal data (hivemind documents no element bound).

Plus, for every codec, the decoded output's rounding to the input dtype.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import msgpack
import pytest
import torch

from geotrain.compression import Codec, Encoded, decode, get_codec, registered_codecs
from geotrain.compression.base import MAX_NUMEL
from geotrain.errors import CodecError, NonFiniteError

VARIANTS = [
    "int8:block=64,scale=fp16",
    "int8:block=32,scale=fp32",
    "int4:grid=e2m1",
    "int4:block=64,scale=fp32",
    "topk:values=fp16",
    "topk:fraction=0.1,chunk=64",
    "fp16:allow_nonfinite=true",
]
HAVE_BNB = importlib.util.find_spec("bitsandbytes") is not None
SPECS = sorted(registered_codecs()) + VARIANTS
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
HIVEMIND_REL = {"hivemind-fp16": 1e-3, "hivemind-uniform8": 0.03, "hivemind-quantile8": 0.05, "hivemind-blockwise8": 0.03}


def _codec(spec: str) -> Codec:
    if spec == "hivemind-blockwise8" and not HAVE_BNB:
        pytest.skip("hivemind's BlockwiseQuantization needs bitsandbytes")
    return get_codec(spec)


def _unit(codec: Codec) -> int:
    """The codec's block/chunk length, to probe sizes around its boundaries."""
    cfg: Any = getattr(codec, "config", None)
    for attr in ("block", "chunk"):
        if hasattr(cfg, attr):
            return int(getattr(cfg, attr))
    return 4096 if codec.name == "hivemind-blockwise8" else 64


def _wire(enc: Encoded) -> list[memoryview]:
    """Buffers as they come off a ZMQ socket: read-only memoryviews of fresh bytes."""
    return [memoryview(b.contiguous().view(torch.uint8).numpy().tobytes()) for b in enc.buffers]


def _roundtrip(codec: Codec, x: torch.Tensor) -> tuple[Encoded, torch.Tensor]:
    enc = codec.encode(x)
    assert enc.codec == codec.spec
    meta = msgpack.unpackb(msgpack.packb(enc.meta), strict_map_key=False)  # header survives msgpack
    for b in enc.buffers:
        assert isinstance(b, torch.Tensor) and b.device.type == "cpu" and b.is_contiguous()
    y = decode(enc.codec, meta, _wire(enc))
    assert y.shape == x.shape and y.dtype == x.dtype and y.device.type == "cpu"
    return enc, y


def _blocks_absmax(x: torch.Tensor, block: int) -> torch.Tensor:
    """Per-element max |x| of its block, shape (N,)."""
    flat = x.float().reshape(-1).abs()
    n = flat.numel()
    pad = -n % block
    padded = torch.cat([flat, flat.new_zeros(pad)]).view(-1, block)
    return padded.amax(dim=1, keepdim=True).expand_as(padded).reshape(-1)[:n]


def _check_error(codec: Codec, x: torch.Tensor, y: torch.Tensor) -> None:
    xf, yf = x.float().reshape(-1), y.float().reshape(-1)
    err = (yf - xf).abs()
    out_round = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[x.dtype]
    slack = xf.abs() * out_round * 2 + 1e-7
    name = codec.name
    if name == "none":
        assert torch.equal(x, y)
    elif name in ("fp16", "bf16"):
        wire = 2.0**-11 if name == "fp16" else 2.0**-8
        assert bool((err <= xf.abs() * wire + slack + 2.0**-24).all())
    elif name in ("int8", "int4"):
        cfg: Any = codec.config  # type: ignore[attr-defined]
        div = {"int8": 254.0, "int": 14.0, "e2m1": 6.0}["int8" if name == "int8" else cfg.grid]
        bound = _blocks_absmax(x, cfg.block) / div * 1.01 + slack
        assert bool((err <= bound).all()), float((err - bound).max())
    elif name == "topk":
        cfg = codec.config  # type: ignore[attr-defined]
        c, nc, k = codec.geometry(xf.numel())  # type: ignore[attr-defined]
        padded = torch.cat([xf, xf.new_zeros(nc * c - xf.numel())]).view(nc, c)
        ref = torch.zeros_like(padded, dtype=torch.bool).scatter_(1, padded.abs().topk(k, dim=1).indices, True)
        kept = ref.reshape(-1)[: xf.numel()]
        assert bool((yf[~kept] == 0).all()), "entries outside the top-k must decode to 0"
        kept_max = padded.abs().where(ref, 0.0).amax(dim=1, keepdim=True).expand_as(padded).reshape(-1)
        per_value = 1.0 / 254 if cfg.values == "int8" else 2.0**-8
        bound = kept_max[: xf.numel()] * per_value * 1.01 + slack
        assert bool((err[kept] <= bound[kept]).all())
    elif name in HIVEMIND_REL:
        if xf.numel() >= 1000:
            assert float(err.norm() / xf.norm()) <= HIVEMIND_REL[name]
    else:  # a codec registered elsewhere: at least it must be close
        assert float(err.norm()) <= 0.5 * float(xf.norm()) + 1e-6


def _sizes(codec: Codec) -> list[tuple[int, ...]]:
    u = _unit(codec)
    return [(), (1,), (2, 3), (u - 1,), (u,), (u + 1,), (3, u // 2 + 1), (2 * u + 3,), (5, 4, 3)]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_shapes_dtypes_and_error_bound(spec: str, dtype: torch.dtype) -> None:
    codec = _codec(spec)
    gen = torch.Generator().manual_seed(1234)
    for shape in _sizes(codec):
        x = torch.randn(shape, generator=gen).to(dtype)
        enc, y = _roundtrip(codec, x)
        _check_error(codec, x, y)
        # the ratio estimate (made without encoding) is within 10% of what crossed the wire
        actual = x.numel() * x.element_size() / max(1, enc.nbytes)
        assert abs(codec.estimate_ratio(x.numel(), dtype) - actual) <= 0.1 * actual, shape


@pytest.mark.parametrize("spec", SPECS)
def test_empty_zero_constant_and_heavy_tails(spec: str) -> None:
    codec = _codec(spec)
    for shape in [(0,), (0, 3), (4, 0, 2)]:
        enc, y = _roundtrip(codec, torch.empty(shape))
        assert y.numel() == 0 and enc.nbytes == 0
    _, y = _roundtrip(codec, torch.zeros(3, 1000))
    assert torch.equal(y, torch.zeros(3, 1000))
    x = torch.full((2, 777), -2.5)
    _, y = _roundtrip(codec, x)
    _check_error(codec, x, y)
    gen = torch.Generator().manual_seed(7)
    heavy = torch.distributions.StudentT(2.0).sample((5000,)) * (torch.rand(5000, generator=gen) + 0.1)
    _, y = _roundtrip(codec, heavy)
    if not codec.name.startswith("hivemind"):  # hivemind's bounds only hold for bell-shaped data
        _check_error(codec, heavy, y)


@pytest.mark.parametrize("spec", SPECS)
def test_nonfinite_input_is_refused(spec: str) -> None:
    codec = _codec(spec)
    for bad in (float("nan"), float("inf"), float("-inf")):
        x = torch.randn(3000)
        x[1234] = bad
        if "allow_nonfinite=true" in codec.spec:
            y = codec.decode(codec.encode(x).meta, codec.encode(x).buffers)
            assert not bool(torch.isfinite(y[1234]))
            continue
        with pytest.raises(NonFiniteError):
            codec.encode(x)


@pytest.mark.parametrize("spec", SPECS)
def test_corrupted_or_truncated_encodings_raise_codec_error(spec: str) -> None:
    codec = _codec(spec)
    x = torch.randn(10, 300)
    enc = codec.encode(x)
    good = _wire(enc)
    codec.decode(enc.meta, good)  # sanity: the untouched encoding decodes
    cases: list[tuple[str, Any, list[Any]]] = []
    for i, buf in enumerate(good):
        raw = bytes(buf)
        cases.append((f"buffer {i} truncated", enc.meta, [*good[:i], memoryview(raw[:-1]), *good[i + 1 :]]))
        cases.append((f"buffer {i} too long", enc.meta, [*good[:i], memoryview(raw + b"\0"), *good[i + 1 :]]))
    cases += [
        ("a buffer missing", enc.meta, good[:-1]),
        ("an extra buffer", enc.meta, [*good, memoryview(b"")]),
        ("shape grown", {**enc.meta, "shape": [10, 301]}, good),
        ("negative dim", {**enc.meta, "shape": [-10, -300]}, good),
        ("float dim", {**enc.meta, "shape": [10.0, 300]}, good),
        ("huge shape", {**enc.meta, "shape": [MAX_NUMEL, 4]}, good),
        ("too many dims", {**enc.meta, "shape": [1] * 40}, good),
        ("shape missing", {k: v for k, v in enc.meta.items() if k != "shape"}, good),
        ("bad dtype", {**enc.meta, "dtype": "int64"}, good),
        ("meta not a dict", [1, 2], good),
    ]
    for key, value in enc.meta.items():  # every codec-specific field tampered with
        if key not in ("shape", "dtype"):
            bumped = value + 1 if isinstance(value, int) else "garbage"
            cases.append((f"meta[{key}] tampered", {**enc.meta, key: bumped}, good))
    for what, meta, bufs in cases:
        with pytest.raises(CodecError):
            codec.decode(meta, bufs)
            pytest.fail(f"{spec}: {what} was accepted")


def test_scales_must_be_finite() -> None:
    codec = get_codec("int8")
    enc = codec.encode(torch.randn(1000))
    codes, scales = enc.buffers
    bad = scales.clone()
    bad[1] = float("nan")
    with pytest.raises(CodecError, match="scales"):
        codec.decode(enc.meta, [codes, bad])
    bad[1] = -1.0
    with pytest.raises(CodecError, match="scales"):
        codec.decode(enc.meta, [codes, bad])


def test_decode_accepts_tensors_bytes_and_bytearrays_alike() -> None:
    codec = get_codec("int4")
    x = torch.randn(999)
    enc = codec.encode(x)
    ref = codec.decode(enc.meta, enc.buffers)
    for conv in (bytes, bytearray, lambda b: memoryview(bytearray(b))):
        bufs = [conv(b.view(torch.uint8).numpy().tobytes()) for b in enc.buffers]
        assert torch.equal(codec.decode(enc.meta, bufs), ref)


def test_decode_reads_misaligned_tensor_slices() -> None:
    codec = get_codec("int8:scale=fp32")
    enc = codec.encode(torch.randn(1000))
    codes, scales = enc.buffers
    shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), scales.view(torch.uint8)])[1:]  # offset 1
    assert torch.equal(codec.decode(enc.meta, [codes, shifted]), codec.decode(enc.meta, enc.buffers))


def test_decoded_tensor_does_not_alias_the_wire_buffer() -> None:
    frame = bytearray(torch.randn(100).numpy().tobytes())
    y = get_codec("none").decode({"shape": [100], "dtype": "float32", "wire": "float32"}, [frame])
    frame[:4] = b"\0\0\0\0"
    assert y[0] != 0


def test_spec_rebuilds_an_equivalent_codec() -> None:
    for spec in SPECS:
        if spec == "hivemind-blockwise8" and not HAVE_BNB:
            continue
        codec = get_codec(spec)
        again = get_codec(codec.spec)
        assert again.spec == codec.spec
        x = torch.randn(5000, generator=torch.Generator().manual_seed(3))
        a, b = codec.encode(x), again.encode(x)
        assert a.meta == b.meta and all(torch.equal(p, q) for p, q in zip(a.buffers, b.buffers, strict=True))


def test_compression_ratios_of_the_defaults() -> None:
    n = 1 << 20
    assert get_codec("int8").estimate_ratio(n, torch.float32) >= 3.9
    assert get_codec("int4").estimate_ratio(n, torch.float32) >= 7.5
    assert get_codec("topk").estimate_ratio(n, torch.float32) >= 100
    assert math.isclose(get_codec("fp16").estimate_ratio(n, torch.float32), 2.0)


@pytest.mark.parametrize("spec", ["int8", "int8:scale=fp16", "int8:scale=fp32", "int8:block=64"])
def test_int8_codes_stay_symmetric(spec: str) -> None:
    # scales are rounded up, so no code needs clamping and -128 never appears
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 4096, generator=gen) * torch.logspace(-30, 30, 64)[:, None]
    codes = get_codec(spec).encode(x).buffers[0]
    assert int(codes.min()) >= -127 and int(codes.max()) <= 127
    assert int(codes.abs().max()) == 127
