"""Clear errors when emulation cannot run, and no half-built emulation when a step fails."""

from __future__ import annotations

import os
import shutil

import pytest

from geotrain.emulate import Emulation, EmulationConfig, netns, topology_from_dict
from geotrain.errors import EmulationError
from tests.emulate.support import requires_netns

TOPO = topology_from_dict({
    "regions": {"a": {}, "b": {}},
    "links": [{"a": "a", "b": "b", "bandwidth_gbps": 0.02, "rtt_ms": 50}],
})  # fmt: skip


def test_not_root_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(EmulationError, match="needs root"):
        Emulation(EmulationConfig(topology=TOPO, tag="tnoroot")).setup()


def test_missing_iproute2_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "tc" else "/usr/sbin/" + name)
    with pytest.raises(EmulationError, match="needs tc"):
        Emulation(EmulationConfig(topology=TOPO, tag="tnotc")).setup()


def test_run_in_before_setup_is_refused() -> None:
    with pytest.raises(EmulationError, match="not up"):
        Emulation(EmulationConfig(topology=TOPO, tag="tnotup")).run_in("a", ["true"])


@pytest.mark.netns
@requires_netns
def test_a_failing_step_undoes_the_partial_build(monkeypatch: pytest.MonkeyPatch) -> None:
    real = netns.setup_commands

    def with_a_bad_last_step(config: EmulationConfig) -> list[list[str]]:
        # a real command that the kernel refuses, after every namespace already exists
        return [*real(config), ["ip", "-n", config.namespace("b"), "link", "set", "no-such-if", "up"]]

    monkeypatch.setattr(netns, "setup_commands", with_a_bad_last_step)
    with pytest.raises(EmulationError, match="no-such-if"):
        Emulation(EmulationConfig(topology=TOPO, tag="tpartial")).setup()
    assert netns.list_namespaces("gt-tpartial-") == []
