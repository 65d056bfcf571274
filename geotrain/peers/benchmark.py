"""A peer's compute benchmark: measured FLOP/s, memory and device name.

What is measured? Dense matmul throughput: square ``size x size`` matrices
multiplied repeatedly for about ``max_seconds`` on the peer's device; each
product is ``2 * size**3`` floating-point operations. The planner uses the
figure as a relative speed, so it must be measured the same way on every
peer, not declared. The median of per-batch rates is reported, so a burst of
load from a neighbour process does not decide the figure.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from geotrain.errors import ConfigError

logger = logging.getLogger(__name__)

_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True, kw_only=True)
class BenchmarkConfig:
    """``device``: ``auto`` (CUDA if present, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.

    ``size``: matrix side; None picks 512 on CPU and 4096 on GPU (a GPU reaches its
    throughput only on large products: an H200 gives 38 TFLOP/s fp32 at 1024, 51 at 4096).
    """

    device: str = "auto"
    size: int | None = None
    dtype: str = "float32"
    max_seconds: float = 1.0

    def __post_init__(self) -> None:
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"benchmark.device must be auto, cpu, cuda or cuda:N; got {self.device!r}")
        if self.size is not None and not 16 <= self.size <= 16384:
            raise ConfigError(f"benchmark.size must be in 16..16384; got {self.size}")
        if self.dtype not in _DTYPES:
            raise ConfigError(f"benchmark.dtype must be one of {_DTYPES}; got {self.dtype!r}")
        if not 0 < self.max_seconds <= 30:
            raise ConfigError(f"benchmark.max_seconds must be in (0, 30]; got {self.max_seconds}")


@dataclass(frozen=True, kw_only=True)
class ComputeResult:
    """``flops``: FLOP/s; ``memory_bytes``: RAM (CPU) or device memory (GPU)."""

    device: str  # human-readable device name, e.g. "NVIDIA H200" or "cpu: AMD EPYC ... (2 threads)"
    device_type: str  # "cpu" or "cuda"
    flops: float
    memory_bytes: int
    dtype: str
    size: int
    matmuls: int
    seconds: float


def measure_compute(config: BenchmarkConfig | None = None) -> ComputeResult:
    """Run the matmul benchmark for about ``config.max_seconds``."""
    import torch

    cfg = config or BenchmarkConfig()
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          "cpu" if cfg.device == "auto" else cfg.device)  # fmt: skip
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("benchmark.device is cuda but torch sees no CUDA device; use --device cpu")
    size = cfg.size if cfg.size is not None else (4096 if device.type == "cuda" else 512)
    dtype = getattr(torch, cfg.dtype)
    if device.type == "cpu" and dtype == torch.float16:
        dtype = torch.float32  # fp16 matmul on CPU is emulated and would understate the machine
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)  # (N, N)
    b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtype)  # (N, N)
    out = torch.empty(size, size, device=device, dtype=dtype)  # (N, N)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    flop_per_matmul = 2.0 * size**3
    torch.matmul(a, b, out=out)  # warm-up: first call pays for kernel selection and allocation
    sync()
    # Batch size so one batch takes ~1/20 of the budget; calibrated from one timed matmul.
    t = time.perf_counter()
    torch.matmul(a, b, out=out)
    sync()
    one = max(time.perf_counter() - t, 1e-7)
    per_batch = max(1, int(cfg.max_seconds / 20 / one))
    rates: list[float] = []
    matmuls = 0
    start = time.perf_counter()
    deadline = start + cfg.max_seconds
    while True:
        t = time.perf_counter()
        done = 0
        while done < per_batch and (done == 0 or time.perf_counter() < deadline):
            torch.matmul(a, b, out=out)
            done += 1
        sync()
        elapsed = time.perf_counter() - t
        matmuls += done
        rates.append(done * flop_per_matmul / max(elapsed, 1e-9))
        if time.perf_counter() >= deadline:
            break
    total = time.perf_counter() - start
    name, memory = _describe(device)
    result = ComputeResult(
        device=name,
        device_type=device.type,
        flops=float(statistics.median(rates)),
        memory_bytes=memory,
        dtype=str(dtype).removeprefix("torch."),
        size=size,
        matmuls=matmuls,
        seconds=total,
    )
    logger.info(
        "compute benchmark: %.3g FLOP/s on %s (%d matmuls in %.2fs)", result.flops, name, matmuls, total
    )
    return result


def _describe(device: object) -> tuple[str, int]:
    import torch

    dev = torch.device(device)  # type: ignore[call-overload]
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return str(props.name), int(props.total_memory)
    return f"cpu: {_cpu_model()} ({torch.get_num_threads()} threads)", system_memory_bytes()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown"


def system_memory_bytes() -> int:
    """Physical RAM, or the cgroup's memory limit when that is lower (containers)."""
    total = 0
    try:
        total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < (total or 1 << 62):
            total = int(text)
    return total


def warm_up_torch(device: str = "cpu") -> float:
    """Pay torch's one-time lazy initialisation now, not when the first plan arrives; returns seconds spent.

    Why? The first module built on the ``meta`` device (how stages are built) imports
    torch's decompositions: about 1 s on a CPU core, once per process. The first
    autograd backward and the first AdamW step have smaller one-time costs of their own.
    Run by the agent in the background while it joins the swarm, so a peer that is
    handed a stage starts training at once.
    """
    import torch

    t0 = time.perf_counter()
    with torch.device("meta"):
        torch.nn.Embedding(2, 2)
        torch.nn.Linear(2, 2)
    layer = torch.nn.Linear(4, 4).to(device)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    layer(torch.ones(2, 4, device=device)).sum().backward()
    opt.step()
    return time.perf_counter() - t0
