"""Chunked numpy kernels for the blockwise quantizers, run on a small thread pool.

Why not torch ops: each torch op on a large tensor is an OpenMP parallel region
that ends in a barrier. On a machine whose cores are busy with other work (the
peer's own training step, other processes) one of the OpenMP threads is often
descheduled, and every barrier then waits for it: a loop of a hundred chunked
ops went from ~30 ms to ~600 ms at a load of 8 on 2 cores. numpy ops are
single-threaded and release the GIL, so here each chunk of about 1M elements
(4 MiB, in cache) is a task on a thread pool: no barriers, and a descheduled
worker only delays its own chunk.

Arrays are numpy views of torch tensors (shared memory). bf16 has no numpy
dtype, so bf16 data travels as its uint16 bit pattern and is widened with a
shift (exact).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

__all__ = ["CHUNK_ELEMS", "absmax_rows", "dequantize_rows", "parallel_rows", "quantize_rows"]

#: Elements per task (4 MiB of fp32: stays in cache while a task makes its passes).
CHUNK_ELEMS = 1 << 20
# 1.5 * 2**23: adding it to a float32 v with |v| < 2**22 leaves round-half-even(v) in the low
# mantissa bits, so the lowest byte is the two's complement int8 of round(v).
_MAGIC = np.float32(12582912.0)
assert sys.byteorder == "little", "the quantizers read the low byte of each float32"

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_local = threading.local()


def _workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="geotrain-codec",
                                       initializer=_mark_worker)
        return _pool


def _mark_worker() -> None:
    _local.worker = True


def _forget_pool_after_fork() -> None:
    # a forked child inherits the executor but not its threads: tasks would never run
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def parallel_rows(nrows: int, block: int, task: Callable[[int, int], None]) -> None:
    """Run ``task(r0, r1)`` over row ranges of about CHUNK_ELEMS elements.

    At most ``torch.get_num_threads()`` ranges run at once (the caller's thread
    is one of them), so the process-wide thread budget is respected.
    """
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

    # inline when one thread suffices, or when called from a pool worker (never wait on ourselves)
    if nworkers <= 1 or getattr(_local, "worker", False):
        drain()
        return
    helpers = [_get_pool().submit(drain) for _ in range(nworkers - 1)]
    try:
        drain()
    finally:  # the helpers write into the caller's arrays: wait for them even if we failed
        for future in helpers:
            future.result()


def as_f32(chunk: np.ndarray, bf16: bool) -> np.ndarray:
    """A float32 copy-or-view of a chunk: bf16 bits (uint16) are widened by a 16-bit shift."""
    if bf16:
        return (chunk.astype(np.uint32) << 16).view(np.float32)
    return chunk if chunk.dtype == np.float32 else chunk.astype(np.float32)


def absmax_rows(x: np.ndarray, bf16: bool, out: np.ndarray) -> None:
    """out[r] = max |x[r, :]| for a (rows, block) array; NaN in a row gives NaN."""

    def task(r0: int, r1: int) -> None:
        c = as_f32(x[r0:r1], bf16)
        np.maximum(c.max(axis=1), -c.min(axis=1), out=out[r0:r1])

    parallel_rows(x.shape[0], x.shape[1], task)


# E2M1 magnitude index of |v| in [0, 6] by floor(4 |v|): every midpoint between neighbouring
# grid values (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) is a multiple of 0.25
_E2M1_BY_QUARTER = np.array([0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7], np.uint8)


def quantize_rows(x: np.ndarray, bf16: bool, inv: np.ndarray, codes: np.ndarray, *, kind: str = "int8") -> None:
    """Quantize a (rows, block) array with per-row ``inv = 1 / scale`` into ``codes``.

    - ``int8``: codes (rows, block) int8 = round(x * inv), |x * inv| <= 127;
    - ``int4``: nibble ``round(x * inv) + 8`` (|x * inv| <= 7), two per byte, codes (rows, block / 2);
    - ``e2m1``: nibble ``sign * 8 + E2M1 index of |x * inv|`` (<= 6), two per byte.
    Element 2i of a row goes to the high nibble of byte i.
    """

    def task(r0: int, r1: int) -> None:
        c = as_f32(x[r0:r1], bf16)
        t = np.multiply(c, inv[r0:r1, None])  # (rows, block) fp32, one chunk: stays in cache
        if kind == "e2m1":
            sign = (t.view(np.uint32) >> np.uint32(28)).astype(np.uint8) & np.uint8(8)
            np.abs(t, out=t)
            t *= 4.0
            quarter = np.minimum(t.astype(np.int32), 24)
            u = np.take(_E2M1_BY_QUARTER, quarter) | sign
        else:
            t += _MAGIC
            low = t.view(np.int32)  # (rows, block): its low byte is the int8 value of round(x * inv)
            if kind == "int8":
                codes[r0:r1] = low  # int32 -> int8 keeps the low byte (a contiguous cast, not a strided read)
                return
            u = low.astype(np.uint8) + np.uint8(8)  # 1..15
        np.bitwise_or(u[:, 0::2] << np.uint8(4), u[:, 1::2], out=codes[r0:r1])

    parallel_rows(x.shape[0], x.shape[1], task)


def dequantize_rows(codes: np.ndarray, scales: np.ndarray, out: np.ndarray, *, table: np.ndarray | None = None,
                    out_bf16: bool = False) -> None:
    """out[r, :] = value(codes[r, :]) * scales[r] for (rows, block) output.

    ``table`` (256, 2) maps a packed byte to its two values (int4); without it
    codes are int8 values. ``out_bf16``: ``out`` is uint16 bf16 bits (rounded to
    nearest even from fp32).
    """
    block = out.shape[1]

    def task(r0: int, r1: int) -> None:
        if table is None and not out_bf16 and out.dtype == np.float32:
            np.multiply(codes[r0:r1], scales[r0:r1, None], out=out[r0:r1])  # straight into the output
            return
        if table is None:
            v = np.multiply(codes[r0:r1], scales[r0:r1, None], dtype=np.float32)
        else:
            v = np.take(table, codes[r0:r1], axis=0).reshape(r1 - r0, block)
            v *= scales[r0:r1, None]
        if out_bf16:
            bits = v.view(np.uint32)
            rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
            np.right_shift(rounded, np.uint32(16), out=rounded)
            out[r0:r1] = rounded
        else:
            out[r0:r1] = v

    parallel_rows(out.shape[0], block, task)
