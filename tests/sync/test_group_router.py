"""Handlers register once per transport; stage groups share it through one GroupRouter, owned and closed."""

from __future__ import annotations

import concurrent.futures
import gc
import weakref
from collections.abc import Iterator

import pytest
from torch import nn

from geotrain.errors import ConfigError, TransportError
from geotrain.sync import DiLoCoSync, GroupRouter, Member, RoundStatus, StaticMembership
from geotrain.transport import Message, Transport, TransportConfig
from tests.sync.conftest import exact_config, seeded_model


@pytest.fixture
def pair() -> Iterator[list[Transport]]:
    ts = [Transport(TransportConfig(), peer_id=f"p{i}", region=r).start() for i, r in enumerate(["eu", "us"])]
    try:
        yield ts
    finally:
        for t in ts:
            t.close()


def test_a_second_handler_for_a_kind_is_an_error_unless_replaced(pair: list[Transport]) -> None:
    a, b = pair
    b.serve("echo", lambda m: Message("echo.one"))
    with pytest.raises(TransportError, match="'echo'"):
        b.serve("echo", lambda m: Message("echo.two"))
    with pytest.raises(TransportError, match="'echo'"):
        b.serve_with_origin("echo", lambda m, origin: Message("echo.two"))
    a.connect("p1", b.address)
    assert a.request("p1", Message("echo"), timeout=10).kind == "echo.one"  # the first handler stands
    b.serve("echo", lambda m: Message("echo.two"), replace=True)
    assert a.request("p1", Message("echo"), timeout=10).kind == "echo.two"
    b.unserve("echo")
    b.serve("echo", lambda m: Message("echo.three"))  # free again after unserve
    assert a.request("p1", Message("echo"), timeout=10).kind == "echo.three"


def test_sync_ping_is_served_once_and_a_second_router_is_refused(pair: list[Transport]) -> None:
    a, b = pair
    GroupRouter(b)
    with pytest.raises(TransportError, match="sync.ping"):
        GroupRouter(b)
    # a sync built without the transport's router would serve the same kinds again: refused, not overwritten
    with pytest.raises(TransportError, match="sync.ping"):
        DiLoCoSync(exact_config(group="a"), params=list(seeded_model()().named_parameters()), transport=b,
                   membership=StaticMembership([Member("p1", "us", b.address)]))
    a.connect("p1", b.address)
    assert a.request("p1", Message("sync.ping"), timeout=10).kind == "sync.pong"


def _ask(t: Transport, peer: str, group: str, number: int) -> str:
    reply = t.request(peer, Message("sync.ask", meta={"group": group, "fragment": 0, "number": number}), timeout=10)
    return str(reply.meta.get("status"))


def test_two_groups_on_one_transport_both_get_their_messages_and_a_closed_group_is_collectable(
    pair: list[Transport],
) -> None:
    members = StaticMembership([Member(t.peer_id, t.region, t.address) for t in pair])
    routers = [GroupRouter(t) for t in pair]
    models: dict[tuple[str, int], nn.Module] = {}
    syncs: dict[tuple[str, int], DiLoCoSync] = {}
    for group, seed in (("a", 0), ("b", 1)):
        for i, t in enumerate(pair):
            model = seeded_model(seed)()
            models[(group, i)] = model
            syncs[(group, i)] = DiLoCoSync(exact_config(group=group), params=list(model.named_parameters()),
                                           transport=t, membership=members, router=routers[i])
            for p in model.parameters():  # each member of each group learnt something different
                p.data.add_(0.01 * (i + 1) * (1 + seed))
    assert routers[0].groups == ["a", "b"]
    with pytest.raises(ConfigError, match="'a'"):
        DiLoCoSync(exact_config(group="a"), params=list(seeded_model()().named_parameters()), transport=pair[0],
                   membership=members, router=routers[0])
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = {k: pool.submit(s.after_inner_step, 1) for k, s in syncs.items()}
        outcomes = {k: f.result(timeout=60) for k, f in futures.items()}
    for k, (o,) in outcomes.items():
        assert o.status is RoundStatus.COMMITTED and len(o.contributors) == 2, (k, o)
    for group in ("a", "b"):  # each group's round committed on its own vectors
        assert syncs[(group, 0)].global_flat().equal(syncs[(group, 1)].global_flat())
    assert not syncs[("a", 0)].global_flat().equal(syncs[("b", 0)].global_flat())
    # sync.ask is routed by group: each group answers for its own rounds
    assert _ask(pair[0], "p1", "a", 1) == "committed" and _ask(pair[0], "p1", "b", 1) == "committed"
    assert _ask(pair[0], "p1", "c", 1) == "unknown"

    runner = weakref.ref(syncs[("a", 1)].runner)
    syncs.pop(("a", 1)).close()
    models.pop(("a", 1))
    outcomes.clear()
    futures.clear()
    assert routers[1].groups == ["b"]
    assert _ask(pair[0], "p1", "a", 1) == "unknown" and _ask(pair[0], "p1", "b", 1) == "committed"
    gc.collect()
    assert runner() is None  # nothing on the transport keeps a closed group's runner alive
    routers[1].close()
    with pytest.raises(TransportError):  # sync.ping is not served any more
        pair[0].request("p1", Message("sync.ping"), timeout=0.5)
