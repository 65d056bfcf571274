"""Progress digests: a collector's book refuses bad lines, and members' lines cross the data plane into one
region digest (geotrain.swarm.digest)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import pytest

from geotrain.errors import PeerTimeoutError, ProtocolError
from geotrain.plan import JobPlan, StageSlot
from geotrain.swarm.digest import DIGEST_KIND, DigestBook, DigestRelay, member_line
from geotrain.swarm.records import MemberProgress, PeerStatus, ProgressRecord, RegionDigest, ShardReport
from geotrain.transport import Message, Transport, TransportConfig


def line(**changes: Any) -> dict[str, Any]:
    wire = MemberProgress(plan_version=1, step=5, round=1, tokens=100, loss=2.0, status=PeerStatus.TRAINING,
                          updated_at=10.0).to_wire()
    wire.update(changes)
    return wire


def progress(pid: str, *, step: int = 5, version: int = 1, **changes: Any) -> ProgressRecord:
    fields: dict[str, Any] = dict(peer_id=pid, job_id="j", plan_version=version, step=step, tokens=0, round=0,
                                  bytes_sent=0, bytes_received=0, updated_at=time.time(),
                                  status=PeerStatus.TRAINING)
    fields.update(changes)
    return ProgressRecord(**fields)


def test_the_book_keeps_the_newest_valid_line_and_forgets_old_ones() -> None:
    book = DigestBook(max_members=2)
    book.reset("j", 1)
    book.accept("A", line(), now=0.0)
    book.accept("A", line(step=3, updated_at=5.0), now=1.0)  # older, reordered: changes nothing
    assert book.fresh(1.0, 10.0)["A"].step == 5
    book.accept("B", line(), now=5.0)
    with pytest.raises(ProtocolError, match="2 members held"):
        book.accept("C", line(), now=5.0)
    assert set(book.fresh(12.0, 10.0)) == {"B"}  # A's line came at 0.0: older than 10 s now
    book.reset("j", 2)  # another plan: nothing of the old one counts
    assert book.fresh(12.0, 10.0) == {}


@pytest.mark.parametrize("raw", [
    None, [], "x", line(step="5"), line(step=-1), line(loss=float("nan")), line(status="boss"),
    line(admin=True), {k: v for k, v in line().items() if k != "status"}, line(tokens=1.5),
])  # fmt: skip
def test_the_book_refuses_a_malformed_line_with_a_protocol_error(raw: Any) -> None:
    book = DigestBook()
    with pytest.raises(ProtocolError, match="malformed"):
        book.accept("A", raw, now=0.0)
    assert book.fresh(0.0, 10.0) == {}


def test_a_line_summarises_its_progress_record() -> None:
    shards = [ShardReport(round=1, step=s, start=0, end=1, sha256="0" * 64) for s in (4, 8)]
    got = member_line(progress("A", shards=shards, stats={"lost_round": 1.0}, loss=1.5))
    assert (got.step, got.shard_step, got.lost, got.links, got.loss) == (5, 8, True, 0, 1.5)


class Digests:
    """The swarm's write side of a collector: the digests it published."""

    def __init__(self) -> None:
        self.published: list[RegionDigest] = []
        self.event = threading.Event()

    def publish_digest(self, digest: RegionDigest, *, ttl_s: float) -> bool:
        self.published.append(digest)
        self.event.set()
        return True


def test_lines_cross_the_data_plane_and_only_the_plans_region_members_are_taken() -> None:
    with Transport(TransportConfig(), peer_id="A").start() as a, \
            Transport(TransportConfig(), peer_id="B").start() as b, \
            Transport(TransportConfig(), peer_id="X").start() as x:
        plan = JobPlan(job_id="j", version=1, num_blocks=3, spares=("S",), pipelines=((
            StageSlot(peer="A", start=0, end=1, region="eu", endpoint=a.address),
            StageSlot(peer="B", start=1, end=2, region="eu", endpoint=b.address),
            StageSlot(peer="C", start=2, end=3, region="us", endpoint="tcp://127.0.0.1:1"),
        ),))
        assert plan.collector("eu") == "A" and plan.collector("us") == "C" and plan.collector("ap") is None
        assert plan.spare_collector("us") == "C" and plan.spare_collector("ap") == "A"  # no plan peer in ap
        swarm = Digests()
        collector = DigestRelay(a, swarm, region="eu", plan=lambda: plan)
        collector.serve()
        member = DigestRelay(b, None, region="eu", plan=lambda: plan)
        member.published(progress("B", step=7), period_s=1.0, ttl_s=4.0)
        member.flush(timeout=10)
        assert member.sent == 1

        # hostile or mistaken senders: not in the plan's region, another job, a malformed line
        x.connect("A", a.address)
        bad = [(x, Message(kind=DIGEST_KIND, job="j", plan_version=1, meta={"line": line(), "region": "eu"})),
               (x, Message(kind=DIGEST_KIND, job="other", plan_version=1, meta={"line": line()})),
               (x, Message(kind=DIGEST_KIND, job="j", plan_version=9, meta={"line": line()})),
               (b, Message(kind=DIGEST_KIND, job="j", plan_version=1, meta={"line": {"step": "lots"}}))]

        def refused(sender: Transport, msg: Message) -> bool:
            try:
                sender.request("A", msg, timeout=1.0)
            except PeerTimeoutError:
                return True  # refused: counted and dropped, never answered
            return False

        with concurrent.futures.ThreadPoolExecutor(len(bad)) as pool:
            assert all(pool.map(lambda sm: refused(*sm), bad))
        assert a.stats.dropped["StaleMessageError"] == 3 and a.stats.dropped["ProtocolError"] == 1

        collector.published(progress("A", step=6), period_s=1.0, ttl_s=4.0)
        assert swarm.event.wait(5)
        digest = swarm.published[-1]
        assert (digest.collector, digest.region, digest.plan_version) == ("A", "eu", 1)
        assert {pid: m.step for pid, m in digest.members.items()} == {"A": 6, "B": 7}
        collector.close()
        member.close()
