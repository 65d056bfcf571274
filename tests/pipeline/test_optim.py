"""The inner AdamW: fused where torch has the kernel, the same update as the default one."""

from __future__ import annotations

import torch

from geotrain.pipeline.optim import inner_adamw, is_fused


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def test_fused_where_torch_has_the_kernel_and_the_same_update() -> None:
    fused_model, plain_model = _model(), _model()
    fused = inner_adamw(fused_model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    # torch 2.4 and later fuse AdamW on the CPU; an older torch falls back to the default (and says so here)
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert is_fused(fused) == ((major, minor) >= (2, 4))
    x = torch.randn(32, 8)
    for _ in range(5):
        for model, opt in ((fused_model, fused), (plain_model, plain)):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    for a, b in zip(fused_model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_default_where_no_fused_kernel_applies() -> None:
    # torch has no fused kernel for parameters on the meta device
    meta = torch.nn.Linear(4, 4, device="meta")
    assert not is_fused(inner_adamw(meta.parameters(), lr=1e-3))
