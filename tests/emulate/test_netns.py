"""Real namespaces, real htb, real TCP: shaped rates hold, teardown and stale cleanup leave nothing.

Needs root and ``ip``/``tc``; skipped otherwise. Each test builds its own
emulation under its own tag, so a failed test cannot disturb the next one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from geotrain.emulate import Emulation, EmulationConfig, cleanup, status, topology_from_dict
from geotrain.emulate.netns import list_namespaces
from geotrain.emulate.probe import tcp_goodput
from tests.emulate.support import requires_netns

pytestmark = [
    pytest.mark.netns,
    pytest.mark.timeout(60),
    requires_netns,
]

MBIT = 1e6 / 8  # bytes/s
TOPO = topology_from_dict({
    "regions": {"a": {}, "b": {}, "c": {}},
    "links": [
        # bandwidth_gbps 0.02 = 20 Mbit/s; RTT is the transport's business (LinkEmulator), not the kernel's
        {"a": "a", "b": "b", "bandwidth_gbps": 0.02, "rtt_ms": 50},
        {"a": "a", "b": "c", "bandwidth_gbps": 0.04, "rtt_ms": 80},
    ],
})  # fmt: skip


@pytest.fixture
def emulation(request: pytest.FixtureRequest) -> Iterator[Emulation]:
    tag = "t" + request.node.name.replace("test_", "").replace("_", "")[:11]
    em = Emulation(EmulationConfig(topology=TOPO, tag=tag))
    try:
        yield em.setup()
    finally:
        em.teardown()


def bulk(em: Emulation, src: str, dst: str, nbytes: int) -> float:
    return tcp_goodput(em, src, dst, nbytes, timeout=20.0)


def test_tcp_bulk_between_regions_runs_at_the_shaped_rate(emulation: Emulation) -> None:
    rate = bulk(emulation, "a", "b", 6_000_000)  # ~2.5 s at 20 Mbit/s
    assert rate == pytest.approx(20 * MBIT, rel=0.15), f"{rate / MBIT:.2f} Mbit/s"
    back = bulk(emulation, "b", "a", 6_000_000)  # each direction has its own class
    assert back == pytest.approx(20 * MBIT, rel=0.15), f"{back / MBIT:.2f} Mbit/s"


def test_each_region_pair_has_its_own_rate(emulation: Emulation) -> None:
    rates: dict[str, float] = {}
    # a -> b (20 Mbit/s) and a -> c (40 Mbit/s) at once: one sender, two classes, neither steals from the other
    to_c = threading.Thread(target=lambda: rates.__setitem__("c", bulk(emulation, "a", "c", 12_000_000)))
    to_c.start()
    rates["b"] = bulk(emulation, "a", "b", 6_000_000)
    to_c.join(30)
    assert rates["b"] == pytest.approx(20 * MBIT, rel=0.15), rates
    assert rates["c"] == pytest.approx(40 * MBIT, rel=0.15), rates
    sent = status(emulation.config.tag)["regions"]["a"]["egress"]
    assert sent["b"]["rate"] == "20Mbit" and sent["c"]["rate"] == "40Mbit"
    assert sent["b"]["sent_bytes"] >= 6_000_000 and sent["c"]["sent_bytes"] >= 12_000_000


def test_intra_region_is_faster_and_unlinked_regions_are_unreachable(emulation: Emulation) -> None:
    inside = bulk(emulation, "b", "b", 24_000_000)
    assert inside > 5 * 20 * MBIT, f"{inside / MBIT:.1f} Mbit/s inside region b"
    s = emulation.socket("b")
    s.settimeout(5)
    with pytest.raises(OSError):  # b and c have no link in the scenario
        s.connect((emulation.address("c"), 9))
    s.close()


def test_run_in_starts_a_process_in_the_region_and_teardown_ends_it() -> None:
    em = Emulation(EmulationConfig(topology=TOPO, tag="trunin")).setup()
    try:
        script = (
            "import json, socket, time\n"
            f"s = socket.socket(); s.bind(({em.address('b')!r}, 0)); s.listen(1)\n"
            "print(json.dumps({'event': 'ready', 'port': s.getsockname()[1]}), flush=True)\n"
            "c, _ = s.accept(); c.sendall(c.recv(100).upper()); c.close()\n"
            "time.sleep(600)  # until teardown ends it\n"
        )
        child = em.run_in("b", [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        ready = json.loads(child.stdout.readline())  # blocks until the child prints or dies
        assert ready["event"] == "ready"
        cli = em.socket("a")
        cli.settimeout(5)
        cli.connect((em.address("b"), ready["port"]))
        cli.sendall(b"hello")
        assert cli.recv(100) == b"HELLO"
        cli.close()
    finally:
        em.teardown()
    assert child.wait(timeout=10) is not None
    assert list_namespaces("gt-trunin-") == []


def test_teardown_and_context_manager_leave_no_namespaces() -> None:
    with Emulation(EmulationConfig(topology=TOPO, tag="tctx")) as em:
        assert set(list_namespaces("gt-tctx-")) == {"gt-tctx-a", "gt-tctx-b", "gt-tctx-c", "gt-tctx-rt"}
        assert status("tctx")["regions"]["c"]["address"] == em.address("c")
    assert list_namespaces("gt-tctx-") == []
    assert status("tctx") == {"tag": "tctx", "up": False, "router": False, "regions": {}}


def test_setup_removes_stale_namespaces_of_its_tag_only() -> None:
    # what a crashed run leaves behind: namespaces of the tag (even a region no longer in the scenario)
    for name in ("gt-tstale-a", "gt-tstale-gone", "gt-tother-a"):
        subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    # and a process the crashed run had started inside one of them
    orphan = subprocess.Popen(["ip", "netns", "exec", "gt-tstale-gone", "sleep", "600"], start_new_session=True)
    try:
        em = Emulation(EmulationConfig(topology=TOPO, tag="tstale")).setup()
        assert orphan.wait(timeout=10) is not None  # ended by the stale cleanup
        assert "gt-tstale-gone" not in list_namespaces("gt-tstale-")
        assert list_namespaces("gt-tother-") == ["gt-tother-a"]  # another tag is not ours to touch
        assert bulk(em, "a", "b", 600_000) > 0  # the fresh build works over the leftovers' names
        em.teardown()
        assert list_namespaces("gt-tstale-") == []
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait(timeout=10)
        cleanup("tother")
        cleanup("tstale")
