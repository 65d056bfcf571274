"""Item 6: a state donor dies half-way through a transfer; the joiner never trains on partial weights.

The joiner asks donor ``a`` first, through a :class:`FaultProxy` that resets the
link once half of the reply has gone down it: to the joiner that is exactly a
donor killed mid-transfer. ZMQ delivers nothing of a cut message, the request
times out, and the joiner takes the state from donor ``b``, verified by names,
byte count and SHA-256. Donors that answer with truncated or altered state
(a buggy or hostile donor) fail that verification and are skipped too.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from geotrain.errors import StateTransferError
from geotrain.sync.state import KIND, StageState, digest, fetch_state, serve_state
from geotrain.testing.faultproxy import Fault, FaultProxy, FaultProxyConfig
from geotrain.transport import Message, Transport

JOB = "job-x"
NAMES = [f"blocks.{b}.w{i}" for b in range(2) for i in range(2)]


def state(seed: int) -> StageState:
    g = torch.Generator().manual_seed(seed)
    params = {n: torch.randn(256, 256, generator=g) for n in NAMES}  # 1 MiB of fp32 in all
    momentum = {n: torch.randn(256, 256, generator=g) for n in NAMES}
    return StageState(JOB, round=7, step=70, params=params, momentum=momentum)


def reply_bytes(st: StageState) -> int:
    tensors = {f"p:{n}": t for n, t in st.params.items()} | {f"o:{n}": t for n, t in st.momentum.items()}
    return digest(tensors)[1]


def test_donor_cut_at_half_the_transfer_is_skipped_for_a_verified_one(net: Callable[[str], Transport]) -> None:
    a, b, joiner = net("a"), net("b"), net("joiner")
    sa, sb = state(1), state(2)
    serve_state(a, lambda: None, lambda: sa)
    serve_state(b, lambda: None, lambda: sb)
    with FaultProxy(FaultProxyConfig(target=a.address)) as proxy:
        joiner.connect("a", proxy.address)
        joiner.connect("b", b.address)
        # the proxy counts from here: the request goes up, the reply (and ZMQ handshake bytes) come down
        half = reply_bytes(sa) // 2
        proxy.set_fault(Fault(kind="reset", after_bytes=half, direction="down"))
        got = fetch_state(joiner, ["a", "b"], job_id=JOB, start=0, end=2, need=NAMES, timeout=3.0)
        assert proxy.wait_fired(1.0) and proxy.stats.fired_at == half  # the cut really landed mid-reply
    assert digest(got.params) == digest(sb.params)  # b's state, whole; nothing of a's half
    assert digest(got.momentum) == digest(sb.momentum)
    assert (got.round, got.step) == (7, 70)


def _lying_donor(t: Transport, st: StageState, mangle: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """Serves ``st`` with the honest meta (names, bytes, hash) but mangled tensors."""

    def handle(req: Message) -> Message:
        tensors = {f"p:{n}": v.clone() for n, v in st.params.items()}
        sha, nbytes = digest(tensors)
        meta = {"round": st.round, "step": st.step, "sha256": sha, "nbytes": nbytes, "names": sorted(tensors)}
        mangle(tensors)
        return Message(kind=KIND + ".ok", meta=meta, tensors=tensors)

    t.serve(KIND, handle)


def _truncate(tensors: dict[str, torch.Tensor]) -> None:
    name = sorted(tensors)[0]
    tensors[name] = tensors[name][:128]  # half a tensor


def _drop_one(tensors: dict[str, torch.Tensor]) -> None:
    del tensors[sorted(tensors)[-1]]


def _flip_one(tensors: dict[str, torch.Tensor]) -> None:
    tensors[sorted(tensors)[0]].view(-1)[12345] += 1.0


@pytest.mark.parametrize("mangle", [_truncate, _drop_one, _flip_one], ids=["truncated", "missing", "tampered"])
def test_a_donor_whose_state_fails_verification_is_skipped(
    net: Callable[[str], Transport], mangle: Callable[[dict[str, torch.Tensor]], None]
) -> None:
    bad, good, joiner = net("bad"), net("good"), net("joiner")
    sb = state(3)
    _lying_donor(bad, state(4), mangle)
    serve_state(good, lambda: None, lambda: sb)
    for name, t in (("bad", bad), ("good", good)):
        joiner.connect(name, t.address)
    got = fetch_state(joiner, ["bad", "good"], job_id=JOB, start=0, end=2, need=NAMES, timeout=10.0)
    assert digest(got.params) == digest(sb.params)
    with pytest.raises(StateTransferError, match="failed verification"):
        fetch_state(joiner, ["bad"], job_id=JOB, start=0, end=2, need=NAMES, timeout=10.0)
