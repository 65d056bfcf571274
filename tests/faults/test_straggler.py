"""Item 8: a straggler whose links are byte-rate capped is waited for up to a deadline scaled by the
payload and the configured bandwidth, then excluded; it still ends the round with the group's weights.

Four members (eu, eu, us, us) on real transports; the straggler (a plain member
in eu) reaches every other member through a :class:`FaultProxy` with a rate cap.
The round deadline is ``D = max(floor, slack x payload / bandwidth)``, here about
4 s for a 1 MiB fragment; a member's vector must reach its leader by 0.3 D.
A cap that delivers in time keeps the straggler counted; a cap that cannot
delivers too late: the round commits without it, by about 2 D at the latest.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from geotrain.sync import DiLoCoConfig, DiLoCoSync, Member, RoundId, RoundRoles, StaticMembership
from geotrain.testing.faultproxy import Fault, FaultProxy, FaultProxyConfig
from geotrain.transport import Transport, TransportConfig

REGIONS = ["eu", "eu", "us", "us"]
N = 256 * 1024  # parameters: a 1 MiB fp32 fragment
CONFIG = DiLoCoConfig(every=1, outer_lr=1.0, outer_momentum=0.0, nesterov=False, intra_codec="none",
                      cross_codec="none", error_feedback=False, deadline_floor_s=0.5, deadline_slack=4.0,
                      bandwidth_bytes_per_s=2e6)


@pytest.fixture
def resources() -> Iterator[list]:
    held: list = []
    yield held
    for r in reversed(held):
        r.close()


def _model() -> nn.Linear:
    torch.manual_seed(0)  # every member starts from the same weights
    return nn.Linear(512, 512, bias=False)


def _run_round(resources: list, cap_bytes_per_s: float) -> tuple[str, dict, float]:
    ts = [Transport(TransportConfig(), peer_id=f"p{i}", region=r).start() for i, r in enumerate(REGIONS)]
    resources.extend(ts)
    members = [Member(t.peer_id, t.region, t.address) for t in ts]
    roles = RoundRoles.build(members, RoundId(0, 1), hierarchical=True)
    busy = {m.peer_id for m in roles.leaders.values()} | {roles.coordinator.peer_id}
    slow = next(m for m in members if m.region == "eu" and m.peer_id not in busy)
    # the straggler sees every other member through a rate-capped proxy
    seen_by_slow = []
    for m in members:
        if m.peer_id == slow.peer_id:
            seen_by_slow.append(m)
            continue
        proxy = FaultProxy(FaultProxyConfig(target=m.address, fault=Fault(kind="rate", rate_bytes_per_s=cap_bytes_per_s)))
        resources.append(proxy.start())
        seen_by_slow.append(Member(m.peer_id, m.region, proxy.address))
    syncs = {}
    for i, t in enumerate(ts):
        view = seen_by_slow if t.peer_id == slow.peer_id else members
        model = _model()
        syncs[t.peer_id] = DiLoCoSync(CONFIG, params=list(model.named_parameters()), transport=t,
                                      membership=StaticMembership(view))
        with torch.no_grad():  # local progress since the common start: a pseudo-gradient to sync
            model.weight.add_(
                torch.randn(512, 512, generator=torch.Generator().manual_seed(i)) * 0.01)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = {pid: pool.submit(s.after_inner_step, 1) for pid, s in syncs.items()}
        outcomes = {pid: f.result(timeout=60)[0] for pid, f in futures.items()}
    first = next(iter(syncs.values())).global_flat()
    assert all(torch.equal(s.global_flat(), first) for s in syncs.values())  # the straggler too
    for s in syncs.values():
        s.close()
    return slow.peer_id, outcomes, CONFIG.deadline_s(8 * N)


def test_a_straggler_within_the_scaled_deadline_is_counted(resources: list) -> None:
    slow, outcomes, d = _run_round(resources, cap_bytes_per_s=8e6)  # 1 MiB in ~0.13 s << 0.3 D
    assert d > 3.0  # the deadline grew with the payload beyond the 0.5 s floor
    for out in outcomes.values():
        assert out.committed and slow in out.contributors and len(out.contributors) == 4, out.reason


def test_a_straggler_beyond_the_scaled_deadline_is_excluded_by_it(resources: list) -> None:
    slow, outcomes, d = _run_round(resources, cap_bytes_per_s=2.5e5)  # 1 MiB in ~4 s > 0.3 D
    for pid, out in outcomes.items():
        assert out.committed, (pid, out.reason)
        assert slow not in out.contributors and len(out.contributors) == 3
    leader_view = [o for o in outcomes.values() if slow in o.excluded]
    # left out by the round's own gather deadline (nobody waited for its bytes past it)
    assert leader_view and "missed the gather deadline" in leader_view[0].excluded[slow]
