"""Stage state fetched in chunks from several donors at once, verified as one donor's whole state.

Loopback transports; each donor counts the requests it answered. Chunks are kept only from donors of the best
donor's round, step and whole-piece hash, and the assembled state must hash to that piece: two donors that
disagree never yield a mix, a donor that lacks the blocks passes its chunk on, and a donor that ignores
``names`` (an older version) makes the fetch fall back to one donor at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from geotrain.sync.state import KIND, StageState, digest, fetch_state, serve_state, split_by_size
from geotrain.transport import Message, Transport

JOB = "job-chunks"
NAMES = [f"blocks.{b}.w{i}" for b in range(2) for i in range(3)]
SIZES = {n: 64 * 64 for n in NAMES}


def state(seed: int, rnd: int = 4) -> StageState:
    g = torch.Generator().manual_seed(seed)
    return StageState(JOB, round=rnd, step=rnd * 10, params={n: torch.randn(64, 64, generator=g) for n in NAMES},
                      momentum={n: torch.randn(64, 64, generator=g) for n in NAMES})


def counted(t: Transport, st: StageState | None) -> list[int]:
    """Serve ``st`` (None: holds nothing) on ``t``; the returned list counts the requests answered."""
    served: list[int] = []
    serve_state(t, lambda: None, lambda: st)
    handler = t._handlers[KIND]  # noqa: SLF001 (wrap the real handler to count its requests)

    def count(req: Message) -> Message | None:
        served.append(len(req.meta.get("names") or []))
        return handler(req)

    t.serve(KIND, count, replace=True)
    return served


def same(a: StageState, b: StageState) -> bool:
    return digest(a.params) == digest(b.params) and digest(a.momentum) == digest(b.momentum)


def fetch(joiner: Transport, donors: list[str], **kw: object) -> StageState:
    return fetch_state(joiner, donors, job_id=JOB, start=0, end=2, need=NAMES, timeout=5.0, sizes=SIZES,
                       parallel=2, **kw)  # type: ignore[arg-type]


def test_chunks_come_from_two_donors_and_make_one_state(net: Callable[[str], Transport]) -> None:
    a, b, joiner = net("a"), net("b"), net("joiner")
    st = state(1)
    served_a, served_b = counted(a, st), counted(b, st)
    for t in (a, b):
        joiner.connect(t.peer_id, t.address)
    got = fetch(joiner, ["a", "b"])
    assert same(got, st) and (got.round, got.step) == (4, 40)
    assert served_a == [3] and served_b == [3]  # half the names each, at once


def test_donors_that_disagree_never_give_a_mix(net: Callable[[str], Transport]) -> None:
    a, b, joiner = net("a"), net("b"), net("joiner")
    sa, sb = state(1), state(2)  # the same round, other weights: one of them is wrong
    served_a, _ = counted(a, sa), counted(b, sb)
    for t in (a, b):
        joiner.connect(t.peer_id, t.address)
    got = fetch(joiner, ["a", "b"])
    assert same(got, sa)  # the best donor's state, whole: b's chunk was asked of a again
    assert len(served_a) == 2


def test_a_donor_without_the_blocks_passes_its_chunk_on(net: Callable[[str], Transport]) -> None:
    a, b, c, joiner = net("a"), net("b"), net("c"), net("joiner")
    st = state(3)
    counted(a, st), counted(b, None), counted(c, st)
    for t in (a, b, c):
        joiner.connect(t.peer_id, t.address)
    assert same(fetch(joiner, ["a", "b", "c"]), st)


def test_an_older_donor_that_ignores_names_means_one_donor_at_a_time(net: Callable[[str], Transport]) -> None:
    a, b, joiner = net("a"), net("b"), net("joiner")
    st = state(4)

    def old_serve(req: Message) -> Message:  # answers as before chunks: everything, no whole-piece hash
        tensors = {f"p:{n}": t for n, t in st.params.items()} | {f"o:{n}": t for n, t in st.momentum.items()}
        sha, nbytes = digest(tensors)
        return Message(kind=KIND + ".ok", meta={"round": st.round, "step": st.step, "sha256": sha, "nbytes": nbytes,
                                               "names": sorted(tensors)}, tensors=tensors)

    for t in (a, b):
        t.serve(KIND, old_serve)
        joiner.connect(t.peer_id, t.address)
    assert same(fetch(joiner, ["a", "b"]), st)


# (a list longer than the header's 4096-element limit never reaches the handler: the transport drops it)
@pytest.mark.parametrize("names", ["blocks.0.w0", [1, 2]], ids=["not_a_list", "not_str"])
def test_a_bad_names_list_is_refused_and_the_donor_keeps_serving(net: Callable[[str], Transport], names: object) -> None:
    a, joiner = net("a"), net("joiner")
    st = state(5)
    serve_state(a, lambda: None, lambda: st)
    joiner.connect("a", a.address)
    bad = joiner.request("a", Message(kind=KIND, meta={"job_id": JOB, "start": 0, "end": 2, "names": names}),
                         timeout=5.0)
    assert bad.kind == KIND + ".err" and bad.meta["error"] == "bad request"
    assert same(fetch_state(joiner, ["a"], job_id=JOB, start=0, end=2, need=NAMES, timeout=5.0), st)


def test_names_split_into_chunks_of_about_equal_size() -> None:
    sizes = {"a": 10, "b": 9, "c": 5, "d": 4, "e": 1}
    chunks = split_by_size(list(sizes), sizes, 2)
    assert sorted(n for c in chunks for n in c) == sorted(sizes)
    loads = sorted(sum(sizes[n] for n in c) for c in chunks)
    assert loads == [14, 15]
    assert split_by_size(["a"], sizes, 4) == [["a"]]
