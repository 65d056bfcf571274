"""The ip/tc command plan: names, addresses, one htb class per destination; no root needed."""

from __future__ import annotations

import ipaddress

import pytest

from geotrain.emulate import EmulationConfig, topology_from_dict
from geotrain.emulate.commands import class_id, setup_commands
from geotrain.errors import ConfigError

TOPO = topology_from_dict({
    "regions": {"us": {}, "eu": {}, "ap": {}},
    "links": [
        {"a": "us", "b": "eu", "bandwidth_gbps": 1.0, "rtt_ms": 76},
        {"a": "us", "b": "ap", "bandwidth_gbps": 0.5, "rtt_ms": 143},
    ],
})  # fmt: skip


def test_names_and_addresses() -> None:
    cfg = EmulationConfig(topology=TOPO, tag="t1")
    assert cfg.router_ns == "gt-t1-rt"
    assert [cfg.namespace(r) for r in TOPO.regions] == ["gt-t1-us", "gt-t1-eu", "gt-t1-ap"]
    assert [cfg.address(r) for r in TOPO.regions] == ["10.251.1.2", "10.251.2.2", "10.251.3.2"]
    assert cfg.subnet("ap") == "10.251.3.0/24"
    with pytest.raises(ConfigError, match="unknown region"):
        cfg.address("mars")


def test_each_directed_pair_gets_its_scaled_rate_on_the_senders_egress() -> None:
    cfg = EmulationConfig(topology=TOPO, tag="t1", scale=10)
    cmds = [" ".join(c) for c in setup_commands(cfg)]
    assert cfg.rate_bps("us", "eu") == pytest.approx(1e9 / 8 / 10)
    # us -> eu is 100 Mbit/s (1 Gbit/s / 10) on gt-t1-us's eth0, class of region 2, filtered by eu's subnet
    cls = class_id(2)
    assert any(c.startswith(f"tc -n gt-t1-us class add dev eth0 parent 1: classid {cls} htb rate 100000000bit ") for c in cmds)
    assert f"tc -n gt-t1-us filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 10.251.2.0/24 flowid {cls}" in cmds
    assert any(c.startswith(f"tc -n gt-t1-eu class add dev eth0 parent 1: classid {class_id(1)} htb rate 100000000bit ") for c in cmds)
    assert any(c.startswith(f"tc -n gt-t1-ap class add dev eth0 parent 1: classid {class_id(1)} htb rate 50000000bit ") for c in cmds)
    # eu and ap have no link: unreachable both ways, and no class for it
    assert "ip -n gt-t1-eu route add unreachable 10.251.3.0/24" in cmds
    assert "ip -n gt-t1-ap route add unreachable 10.251.2.0/24" in cmds
    assert not any(c.startswith(f"tc -n gt-t1-eu class add dev eth0 parent 1: classid {class_id(3)} ") for c in cmds)


def test_every_command_stays_inside_our_namespaces_and_subnet() -> None:
    cfg = EmulationConfig(topology=TOPO, tag="t1", subnet_prefix="10.77")
    ours = {cfg.router_ns, *(cfg.namespace(r) for r in TOPO.regions)}
    inside = ipaddress.IPv4Network("10.77.0.0/16")
    for argv in setup_commands(cfg):
        if argv[:3] == ["ip", "netns", "add"]:
            assert argv[3] in ours
            continue
        # every other command runs inside one of our namespaces (ip/tc -n NS, or ip netns exec NS)
        ns = argv[2] if argv[1] == "-n" else argv[3]
        assert ns in ours, argv
        for word in argv:
            try:
                net = ipaddress.IPv4Network(word, strict=False)
            except ValueError:
                continue
            if "." in word:
                assert net.subnet_of(inside), argv


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tag": "a-b"}, "tag"),
        ({"tag": ""}, "tag"),
        ({"scale": 0.0}, "scale"),
        ({"subnet_prefix": "8.8"}, "private"),
        ({"subnet_prefix": "10"}, "two octets"),
        ({"scale": 1e9}, "below 1 kbit/s"),
        ({"burst_bytes": 10}, "burst"),
    ],
)
def test_config_validation_says_the_fix(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        EmulationConfig(topology=TOPO, **kwargs)  # type: ignore[arg-type]


def test_router_name_is_reserved() -> None:
    with pytest.raises(ConfigError, match="reserved"):
        EmulationConfig(topology=topology_from_dict({"regions": {"rt": {}}}))
