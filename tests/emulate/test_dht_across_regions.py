"""hivemind's DHT (control plane) works between processes started in two emulated regions."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from typing import Any

import pytest

from geotrain.emulate import Emulation, EmulationConfig, status, topology_from_dict
from tests.emulate.support import requires_netns

pytestmark = [pytest.mark.netns, pytest.mark.multiprocess, pytest.mark.timeout(90), requires_netns]

TOPO = topology_from_dict({
    "regions": {"a": {}, "b": {}},
    "links": [{"a": "a", "b": "b", "bandwidth_gbps": 0.02, "rtt_ms": 100}],
})  # fmt: skip

STORE = """
import json, sys, time
import hivemind
from hivemind.utils import get_dht_time
dht = hivemind.DHT(host_maddrs=[sys.argv[1]], start=True)
dht.store("gt-emulate-test", "stored-in-a", expiration_time=get_dht_time() + 60)
print(json.dumps({"event": "ready", "maddrs": [str(m) for m in dht.get_visible_maddrs()]}), flush=True)
time.sleep(120)  # until teardown ends it
"""
GET = """
import json, sys
import hivemind
dht = hivemind.DHT(host_maddrs=[sys.argv[1]], initial_peers=[sys.argv[2]], start=True)
found = dht.get("gt-emulate-test", latest=True)
print(json.dumps({"event": "got", "value": None if found is None else found.value}), flush=True)
dht.shutdown()
"""


def first_json_line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The child's first JSON line, or a failure naming what it printed to stderr."""
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"no output within {timeout}s")
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        pytest.fail(f"child exited ({proc.wait(5)}) without output: {err[-2000:]}")
    out: dict[str, Any] = json.loads(line)
    return out


def test_a_record_stored_in_one_region_is_read_in_another() -> None:
    with Emulation(EmulationConfig(topology=TOPO, tag="tdht")) as em:
        popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        a = em.run_in("a", [sys.executable, "-c", STORE, f"/ip4/{em.address('a')}/tcp/0"], **popen)
        ready = first_json_line(a, timeout=40)
        # a's DHT announces only its region address: a peer elsewhere must come through the router
        assert ready["maddrs"] and all(m.startswith(f"/ip4/{em.address('a')}/") for m in ready["maddrs"])
        b = em.run_in("b", [sys.executable, "-c", GET, f"/ip4/{em.address('b')}/tcp/0", ready["maddrs"][0]], **popen)
        assert first_json_line(b, timeout=40) == {"event": "got", "value": "stored-in-a"}
        assert b.wait(timeout=20) == 0
        # the DHT's traffic really crossed the shaped a<->b link
        egress = status("tdht")["regions"]["b"]["egress"]["a"]
        assert egress["sent_bytes"] > 0
    assert a.poll() is not None  # teardown ended the long-running child
