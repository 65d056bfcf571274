"""What ``ip``/``tc`` commands build an emulation: pure, so it is testable without root.

Layout (one *emulation* = one tag)::

    gt-<tag>-<region A>           gt-<tag>-rt (router, forwarding on)          gt-<tag>-<region B>
    eth0 10.251.1.2/24  <-veth->  r1 10.251.1.1/24   r2 10.251.2.1/24  <-veth->  eth0 10.251.2.2/24
    htb on eth0: one class per                                                   htb on eth0: ...
    destination region, u32 filter
    on the destination subnet

Region number ``k`` (1-based, in scenario order) owns subnet ``<prefix>.k.0/24``;
its *host address* ``<prefix>.k.2`` is where peers of that region bind. Peers
of one region share its namespace and talk over its host address at full
speed (intra-region). Traffic to another region leaves ``eth0`` through the
htb class of that destination, whose rate is the scenario link's bandwidth
divided by ``scale``: each direction of each region pair is shaped on its
sender's side, where TCP feels the backpressure instead of losing packets.
A region pair with no link gets an ``unreachable`` route. Each region routes
only ``<prefix>.0.0/16`` to the router and the router has no default route,
so nothing can leave the namespaces this module creates.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass

from geotrain.emulate.topology import Topology
from geotrain.errors import ConfigError

NS_PREFIX = "gt-"
ROUTER = "rt"
REGION_IFACE = "eth0"
DEFAULT_CLASS = 1  # htb class for traffic to the router itself (ARP, ICMP errors): unshaped
MIN_RATE_BPS = 125.0  # 1 kbit/s; htb cannot do much less
TAG_RE = re.compile(r"^[a-z0-9]{1,12}$")


@dataclass(frozen=True, kw_only=True)
class EmulationConfig:
    """One emulation: which topology, under which tag, at which bandwidth scale.

    ``tag``: short name (lowercase letters/digits, no '-') so that ``gt-<tag>-*``
    names exactly this emulation's namespaces. ``scale``: divisor applied to
    every bandwidth (10 emulates a 1 Gbit/s WAN at 100 Mbit/s). ``subnet_prefix``:
    the private /16 (two octets) whose /24s the regions get; it exists only
    inside the namespaces. ``burst_bytes``: the htb burst (at least 2 ms of the
    class rate is used when that is larger).
    """

    topology: Topology
    tag: str = "main"
    scale: float = 1.0
    subnet_prefix: str = "10.251"
    burst_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        if not TAG_RE.match(self.tag):
            raise ConfigError(f"emulate.tag must be 1-12 lowercase letters or digits (no '-'); got {self.tag!r}")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ConfigError(f"emulate.scale must be a number > 0 (bandwidths are divided by it); got {self.scale}")
        try:
            net = ipaddress.ip_network(f"{self.subnet_prefix}.0.0/16")
        except ValueError:
            raise ConfigError(
                f"emulate.subnet_prefix must be two octets like '10.251'; got {self.subnet_prefix!r}"
            ) from None
        if not net.is_private or net.is_loopback or net.is_link_local:
            raise ConfigError(f"emulate.subnet_prefix {self.subnet_prefix} must name a private range (10.x or 192.168)")
        if len(self.topology.regions) > 250:
            raise ConfigError(f"emulation supports at most 250 regions; got {len(self.topology.regions)}")
        if ROUTER in self.topology.regions:
            raise ConfigError(f"region name {ROUTER!r} is reserved for the emulation's router; rename that region")
        if self.burst_bytes < 2048:
            raise ConfigError(f"emulate.burst_bytes must be >= 2048 (a packet must fit); got {self.burst_bytes}")
        for (a, b), link in self.topology.links.items():
            if a != b and link.bandwidth_bps / self.scale < MIN_RATE_BPS:
                raise ConfigError(f"link {a}-{b} at scale {self.scale} is below 1 kbit/s; use a smaller scale")

    # -- names and addresses -----------------------------------------------------------------------
    @property
    def router_ns(self) -> str:
        return f"{NS_PREFIX}{self.tag}-{ROUTER}"

    @property
    def ns_prefix(self) -> str:
        """Every namespace of this emulation starts with this (``gt-<tag>-``)."""
        return f"{NS_PREFIX}{self.tag}-"

    def namespace(self, region: str) -> str:
        self._index(region)
        return f"{self.ns_prefix}{region}"

    def _index(self, region: str) -> int:
        try:
            return self.topology.regions.index(region) + 1
        except ValueError:
            raise ConfigError(f"unknown region {region!r}; the scenario has {list(self.topology.regions)}") from None

    def subnet(self, region: str) -> str:
        return f"{self.subnet_prefix}.{self._index(region)}.0/24"

    def address(self, region: str) -> str:
        """The region's host address: peers in that region bind here."""
        return f"{self.subnet_prefix}.{self._index(region)}.2"

    def gateway(self, region: str) -> str:
        return f"{self.subnet_prefix}.{self._index(region)}.1"

    def rate_bps(self, src: str, dst: str) -> float | None:
        """Shaped rate src -> dst in bytes/s (scenario bandwidth / scale); None when unshaped or unlinked."""
        if src == dst:
            return None
        link = self.topology.link(src, dst)
        return None if link is None else link.bandwidth_bps / self.scale


def class_id(dst_index: int) -> str:
    """htb class of the destination region with 1-based number ``dst_index`` (tc reads minor ids as hex)."""
    return f"1:{0x10 + dst_index:x}"


def _htb_params(rate_bps: float, burst_bytes: int) -> list[str]:
    bits = max(1, round(rate_bps * 8))
    burst = max(burst_bytes, int(rate_bps * 0.002))  # >= 2 ms at the rate, so timer slack does not cut it
    # quantum only splits spare bandwidth between siblings; keep it >= MTU and within htb's sane range
    quantum = min(max(int(rate_bps / 10), 1600), 200_000)
    return ["rate", f"{bits}bit", "ceil", f"{bits}bit", "burst", str(burst), "cburst", str(burst), "quantum", str(quantum)]


def rate_commands(config: EmulationConfig, src: str, dst: str, rate_bps: float) -> list[list[str]]:
    """The command that reshapes the running link ``src -> dst`` to ``rate_bps`` bytes/s (a link that degrades
    or recovers mid-run; the other direction keeps its rate)."""
    if src == dst or config.rate_bps(src, dst) is None:
        raise ConfigError(f"no shaped link {src} -> {dst} in this emulation")
    if not rate_bps >= MIN_RATE_BPS:
        raise ConfigError(f"a link rate must be >= {MIN_RATE_BPS} bytes/s; got {rate_bps}")
    j = config.topology.regions.index(dst) + 1
    return [["tc", "-n", config.namespace(src), "class", "change", "dev", REGION_IFACE, "parent", "1:",
             "classid", class_id(j), "htb", *_htb_params(rate_bps, config.burst_bytes)]]


def setup_commands(config: EmulationConfig) -> list[list[str]]:
    """Every command, in order, that builds the emulation (after stale namespaces are gone)."""
    regions = config.topology.regions
    rt = config.router_ns
    cmds: list[list[str]] = [["ip", "netns", "add", rt]]
    cmds += [["ip", "netns", "add", config.namespace(r)] for r in regions]
    cmds.append(["ip", "-n", rt, "link", "set", "lo", "up"])
    cmds.append(["ip", "netns", "exec", rt, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
    for k, region in enumerate(regions, start=1):
        ns, r_if = config.namespace(region), f"r{k}"
        cmds += [
            ["ip", "-n", rt, "link", "add", r_if, "type", "veth", "peer", "name", REGION_IFACE, "netns", ns],
            ["ip", "-n", rt, "addr", "add", f"{config.gateway(region)}/24", "dev", r_if],
            ["ip", "-n", rt, "link", "set", r_if, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", ns, "addr", "add", f"{config.address(region)}/24", "dev", REGION_IFACE],
            ["ip", "-n", ns, "link", "set", REGION_IFACE, "up"],
            ["ip", "-n", ns, "route", "add", f"{config.subnet_prefix}.0.0/16", "via", config.gateway(region)],
            ["tc", "-n", ns, "qdisc", "add", "dev", REGION_IFACE, "root", "handle", "1:", "htb",
             "default", f"{DEFAULT_CLASS:x}"],
            ["tc", "-n", ns, "class", "add", "dev", REGION_IFACE, "parent", "1:", "classid", f"1:{DEFAULT_CLASS:x}",
             "htb", *_htb_params(10e9 / 8, config.burst_bytes)],
        ]  # fmt: skip
        for j, dst in enumerate(regions, start=1):
            if dst == region:
                continue
            rate = config.rate_bps(region, dst)
            if rate is None:
                cmds.append(["ip", "-n", ns, "route", "add", "unreachable", config.subnet(dst)])
                continue
            cmds += [
                ["tc", "-n", ns, "class", "add", "dev", REGION_IFACE, "parent", "1:", "classid", class_id(j),
                 "htb", *_htb_params(rate, config.burst_bytes)],
                ["tc", "-n", ns, "filter", "add", "dev", REGION_IFACE, "parent", "1:", "protocol", "ip",
                 "prio", "1", "u32", "match", "ip", "dst", config.subnet(dst), "flowid", class_id(j)],
            ]  # fmt: skip
    return cmds
