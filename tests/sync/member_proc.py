"""A stage-group member as its own process, for the SIGKILL test.

Run as ``python -m tests.sync.member_proc --peer-id p0 --region eu``. Prints JSON
lines: ``ready`` (with its data-plane address), then, once the test sent the
member list as a ``test.members`` message, one ``round`` line per round with
the sha256 of its global parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch
from torch import nn

from geotrain.sync import DiLoCoConfig, DiLoCoSync, Member, StaticMembership
from geotrain.transport import Transport, TransportConfig


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--peer-id", required=True)
    p.add_argument("--region", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--floor", type=float, default=2.0)
    p.add_argument("--hold-at", type=int, default=0,
                   help="after round_start of this round, wait for a test.resume message before syncing")
    args = p.parse_args()
    torch.set_num_threads(1)
    transport = Transport(TransportConfig(), peer_id=args.peer_id, region=args.region).start()
    try:
        emit(event="ready", address=transport.address)
        msg = transport.recv("test.members", timeout=60.0)
        members = [Member(str(a), str(b), str(c)) for a, b, c in msg.meta["members"]]
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
        config = DiLoCoConfig(
            every=1, outer_lr=0.7, outer_momentum=0.9, cross_codec="int8", intra_codec="none",
            deadline_floor_s=args.floor,
        )
        sync = DiLoCoSync(config, params=list(model.named_parameters()), transport=transport,
                          membership=StaticMembership(members))
        for r in range(1, args.rounds + 1):
            g = torch.Generator().manual_seed(int(hashlib.sha256(f"{args.peer_id}:{r}".encode()).hexdigest()[:8], 16))
            with torch.no_grad():
                for q in model.parameters():
                    q.add_(torch.randn(q.shape, generator=g) * 0.01)
            emit(event="round_start", round=r)
            if r == args.hold_at:  # the test freezes this process here: it must not sync before it is frozen
                transport.recv("test.resume", timeout=300.0)
            t0 = time.monotonic()
            (outcome,) = sync.after_inner_step(r)
            digest = hashlib.sha256(sync.global_flat().numpy().tobytes()).hexdigest()
            emit(event="round", round=r, committed=outcome.committed, contributors=list(outcome.contributors),
                 reason=outcome.reason, seconds=time.monotonic() - t0, global_sha=digest)
        emit(event="done")
        transport.recv("test.stop", timeout=60.0)
    finally:
        transport.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
