"""Chunked kernels of the blockwise quantizers, run on a small pool of single-threaded workers.

Why a pool: each torch op on a large tensor is an OpenMP parallel region that
ends in a barrier. On a machine whose cores are busy with other work (the
peer's own training step, other processes) one OpenMP thread is often
descheduled and every barrier waits for it; measured on the shared 2-core box
at load ~10, 50 amax/amin pairs on a 1M-element chunk took 700 ms with 2
OpenMP threads and 46 ms in one thread. So the work is cut into chunks of about
1M elements (4 MiB: in cache while a task makes its passes), and each chunk is
a task for a pool worker whose OpenMP team is one thread: no barriers, and a
descheduled worker only delays its own chunk. At most
``torch.get_num_threads()`` workers run one call's tasks.

A worker gets its one-thread team through libgomp's ``omp_set_num_threads``,
which sets only the calling thread's value (torch's own setter would change the
process-wide default too). Where torch is not built with GNU OpenMP the workers
keep torch's default and the kernels are just as correct, only more exposed to
load.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ["CHUNK_ELEMS", "absmax_rows", "cast_flat", "dequantize_rows", "minmax_flat", "parallel_rows", "quantize_chunk",
           "quantize_rows"]

log = logging.getLogger(__name__)

#: Elements per task (4 MiB of fp32).
CHUNK_ELEMS = 1 << 20
# 1.5 * 2**23: adding it to a float32 v with |v| < 2**22 leaves round-half-even(v) in the low
# mantissa bits, so the float's bits read as int32 end in the int8 value of round(v).
_MAGIC = torch.tensor(12582912.0)
# E2M1 magnitude index of |v| in [0, 6] by floor(4 |v|): every midpoint between neighbouring
# grid values (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) is a multiple of 0.25
_E2M1_BY_QUARTER = torch.tensor([0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7],
                                dtype=torch.uint8)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_local = threading.local()


def _workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def _libgomp() -> ctypes.CDLL | None:
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _init_worker() -> None:
    _local.worker = True
    torch.zeros(1).add_(1)  # torch sets this thread's OpenMP team size on first use; do it now
    gomp = _libgomp()
    if gomp is not None:
        gomp.omp_set_num_threads(1)  # this thread only
    if torch.get_num_threads() != 1:
        log.debug("codec workers keep %d OpenMP threads (no libgomp found)", torch.get_num_threads())


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="geotrain-codec",
                                       initializer=_init_worker)
        return _pool


def _forget_pool_after_fork() -> None:
    # a forked child inherits the executor but not its threads: tasks would never run
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def _scratch(rows: int, block: int) -> torch.Tensor:
    """This thread's reusable fp32 buffer of at least (rows, block)."""
    buf = getattr(_local, "scratch", None)
    if buf is None or buf.numel() < rows * block:
        buf = torch.empty(max(rows * block, CHUNK_ELEMS), dtype=torch.float32)
        _local.scratch = buf
    return buf[: rows * block].view(rows, block)


def parallel_rows(nrows: int, block: int, task: Callable[[int, int], None]) -> None:
    """Run ``task(r0, r1)`` over row ranges of about CHUNK_ELEMS elements on the worker pool."""
    rows = max(1, CHUNK_ELEMS // block)
    ranges = iter([(r0, min(nrows, r0 + rows)) for r0 in range(0, nrows, rows)])
    nworkers = min(-(-nrows // rows), torch.get_num_threads(), _workers())
    lock = threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                r = next(ranges, None)
            if r is None:
                return
            task(*r)

    if getattr(_local, "worker", False):  # called from a worker: never wait on ourselves
        drain()
        return
    futures = [_get_pool().submit(drain) for _ in range(max(1, nworkers))]
    for future in futures:
        future.result()


def absmax_rows(x: torch.Tensor, out: torch.Tensor) -> None:
    """out[r] = max |x[r, :]| (fp32) for a (rows, block) tensor; NaN in a row gives NaN."""

    def task(r0: int, r1: int) -> None:
        c = x[r0:r1]
        # max and -min: two reductions that read x without writing an |x| temporary
        torch.maximum(c.amax(dim=1), c.amin(dim=1).neg_(), out=out[r0:r1])

    parallel_rows(x.shape[0], x.shape[1], task)


def quantize_chunk(x: torch.Tensor, inv: torch.Tensor, codes: torch.Tensor, kind: str) -> None:
    """Quantize one (rows, block) chunk with per-row ``inv = 1 / scale`` into ``codes``, in this thread.

    - ``int8``: codes (rows, block) int8 = round(x * inv), |x * inv| <= 127;
    - ``int4``: nibble ``round(x * inv) + 8`` (|x * inv| <= 7), two per byte: codes (rows, block / 2) uint8;
    - ``e2m1``: nibble ``sign * 8 + E2M1 index of |x * inv|`` (<= 6), two per byte.
    Element 2i of a row goes to the high nibble of byte i.
    """
    t = _scratch(x.shape[0], x.shape[1])  # (rows, block) fp32, in cache
    if kind == "e2m1":
        torch.mul(x, inv[:, None], out=t)
        sign = t.view(torch.int32).bitwise_right_shift(28).bitwise_and_(8).to(torch.uint8)
        quarter = t.abs_().mul_(4.0).to(torch.int32).clamp_(max=24)
        u = _E2M1_BY_QUARTER[quarter].bitwise_or_(sign)
    else:
        torch.addcmul(_MAGIC, x, inv[:, None], out=t)
        low = t.view(torch.int32)  # its low byte is the int8 value of round(x * inv)
        if kind == "int8":
            codes.copy_(low)  # int32 -> int8 keeps the low byte
            return
        u = low.to(torch.uint8).add_(8)  # 1..15 (uint8 arithmetic wraps)
    torch.add(u[:, 1::2], u[:, 0::2], alpha=16, out=codes)


def quantize_rows(x: torch.Tensor, inv: torch.Tensor, codes: torch.Tensor, *, kind: str = "int8") -> None:
    """:func:`quantize_chunk` over a whole (rows, block) tensor, chunk by chunk on the pool."""

    def task(r0: int, r1: int) -> None:
        quantize_chunk(x[r0:r1], inv[r0:r1], codes[r0:r1], kind)

    parallel_rows(x.shape[0], x.shape[1], task)


def dequantize_rows(codes: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, *,
                    table: torch.Tensor | None = None) -> None:
    """out[r, :] = value(codes[r, :]) * scales[r] for a (rows, block) output of any float dtype.

    ``table`` (256, 2) maps a packed byte to its two values (int4); without it
    ``codes`` are int8 values.
    """
    block = out.shape[1]

    def task(r0: int, r1: int) -> None:
        o = out[r0:r1]
        t = o if o.dtype == torch.float32 else _scratch(r1 - r0, block)
        if table is None:
            t.copy_(codes[r0:r1])
        else:
            torch.index_select(table, 0, codes[r0:r1].reshape(-1).to(torch.int32), out=t.view(-1, 2))
        t.mul_(scales[r0:r1, None])
        if t is not o:
            o.copy_(t)

    parallel_rows(out.shape[0], block, task)


def minmax_flat(x: torch.Tensor) -> tuple[float, float]:
    """(max, min) of a non-empty 1-D tensor; NaN anywhere gives NaN."""
    n = x.numel()
    nchunks = -(-n // CHUNK_ELEMS)
    part = torch.empty(nchunks, 2, dtype=torch.float32)  # (chunk, [max, min])

    def task(r0: int, r1: int) -> None:
        c = x[r0:r1]
        part[r0 // CHUNK_ELEMS, 0] = c.amax()
        part[r0 // CHUNK_ELEMS, 1] = c.amin()

    parallel_rows(n, 1, task)
    return float(part[:, 0].amax()), float(part[:, 1].amin())


def cast_flat(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst.copy_(src) for 1-D tensors of equal length (a dtype cast), chunk by chunk on the pool."""

    def task(r0: int, r1: int) -> None:
        dst[r0:r1].copy_(src[r0:r1])

    parallel_rows(src.numel(), 1, task)
