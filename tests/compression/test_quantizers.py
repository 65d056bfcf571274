"""The quantizers pick the nearest grid point, exactly (ties aside), on every input dtype."""

from __future__ import annotations

import pytest
import torch

from geotrain.compression import get_codec, kernels

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _reference(v: torch.Tensor, grid: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest grid value to v (in units of the scale) and a mask of elements far from a tie."""
    if grid in ("int8", "int"):
        q = v.round()
        return q, (v - v.floor() - 0.5).abs() > 1e-3
    mags = E2M1[(v.abs()[..., None] - E2M1).abs().argmin(dim=-1)]
    mids = (E2M1[1:] + E2M1[:-1]) / 2
    far = (v.abs()[..., None] - mids).abs().amin(dim=-1) > 1e-3
    return torch.where(v < 0, -mags, mags), far


@pytest.mark.parametrize("spec", ["int8", "int8:block=64", "int4", "int4:grid=e2m1", "int4:block=32,grid=e2m1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_codes_are_the_nearest_grid_point(spec: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "CHUNK_ELEMS", 8192)  # small chunks: many tasks run on the pool
    codec = get_codec(spec)
    block = codec.config.block  # type: ignore[attr-defined]
    grid = "int8" if spec.startswith("int8") else codec.config.grid  # type: ignore[attr-defined]
    gen = torch.Generator().manual_seed(9)
    rows = 400
    x = (torch.randn(rows, block, generator=gen) * torch.rand(rows, 1, generator=gen) * 10).to(dtype)
    enc = codec.encode(x)
    scales = enc.buffers[1].float()  # (rows,) one scale per block
    y = codec.decode(enc.meta, enc.buffers).float()
    v = x.float() / scales[:, None]
    want, far = _reference(v, grid)
    got = y / scales[:, None]
    # compare in units of the scale; bf16/fp16 outputs round the product once more
    tol = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype] * (want.abs() + 1)
    assert bool((((got - want).abs() <= tol) | ~far).all())
    assert float(far.float().mean()) > 0.99


@pytest.mark.multiprocess
def test_kernels_work_in_a_forked_child(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing as mp

    monkeypatch.setattr(kernels, "CHUNK_ELEMS", 4096)  # several tasks: the pool is used
    codec = get_codec("int8")
    x = torch.randn(64, 1024)
    enc = codec.encode(x)  # the parent's pool now exists
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_roundtrip_in_child, (x.numpy(),)).get(timeout=60)
    assert torch.equal(torch.from_numpy(got), codec.decode(enc.meta, enc.buffers))


def _roundtrip_in_child(x: object) -> object:
    kernels.CHUNK_ELEMS = 4096
    codec = get_codec("int8")
    t = torch.from_numpy(x)
    enc = codec.encode(t)
    return codec.decode(enc.meta, enc.buffers).numpy()
