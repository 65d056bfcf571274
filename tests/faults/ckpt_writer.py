"""A checkpoint writer as its own process, for the interrupted-save tests (item 11).

``python -m tests.faults.ckpt_writer --root DIR --step 20 --blocks 0,2 2,4 --mib 1 64 [--fsize-limit N]``
writes one group entry per ``--blocks`` pair with about ``--mib`` MiB of
parameters each, printing ``{"event": "writing", "blocks": [a, b]}`` before each
and ``{"event": "saved"}`` at the end. With ``--fsize-limit`` the process may
not write files larger than N bytes (RLIMIT_FSIZE; SIGXFSZ ignored, so the
write fails with EFBIG instead of killing the process).
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
from pathlib import Path

import torch

from geotrain.peers.checkpoint import save_group
from geotrain.sync.state import StageState


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def group_state(step: int, start: int, end: int, mib: float) -> StageState:
    per = max(1, int(mib * (1 << 20) / 4 / (2 * (end - start))))
    g = torch.Generator().manual_seed(step * 100 + start)
    params = {f"blocks.{b}.w": torch.randn(per, generator=g) for b in range(start, end)}
    momentum = {f"blocks.{b}.w": torch.randn(per, generator=g) for b in range(start, end)}
    return StageState("job", round=step // 5, step=step, params=params, momentum=momentum)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--blocks", nargs="+", required=True)
    p.add_argument("--mib", nargs="+", type=float, required=True)
    p.add_argument("--fsize-limit", type=int, default=None)
    args = p.parse_args()
    if args.fsize_limit is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize_limit, args.fsize_limit))
    emit(event="ready")
    for spec, mib in zip(args.blocks, args.mib, strict=True):
        a, b = (int(x) for x in spec.split(","))
        st = group_state(args.step, a, b, mib)
        emit(event="writing", blocks=[a, b])
        try:
            save_group(Path(args.root), st, start=a, end=b)
        except OSError as e:
            emit(event="failed", blocks=[a, b], error=str(e))
            return 1
    emit(event="saved")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
