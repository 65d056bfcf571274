"""A small real network for the NAT tests: public regions, and a home network behind a masquerading NAT.

Layout (``gt-<tag>-*`` namespaces, deleted on close; nothing routes out of them)::

    p1  10.252.1.2 ─┐                         ┌─ gw (NAT) wan 10.252.3.2 ─┬ lan  192.168.77.1 ── home  192.168.77.2
    p2  10.252.2.2 ─┴─ rt (router) .1.1/.2.1/.3.1 ┘                          └ lan2 192.168.78.1 ── home2 192.168.78.2

``gw`` masquerades what leaves its ``wan`` side and forwards nothing that comes in
on it unless it belongs to a connection a home side opened (outbound only); the two
home networks cannot reach each other either.
The public namespaces and the router count, in an nftables counter, each packet sent
or forwarded towards the home network's private addresses: a peer that tries
to dial the home peer's own address shows up there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence

HOME_NET = "192.168.0.0/16"
ADDR = {"p1": "10.252.1.2", "p2": "10.252.2.2", "gw": "10.252.3.2", "home": "192.168.77.2", "home2": "192.168.78.2"}
_NAMES = ("p1", "p2", "rt", "gw", "home", "home2")
_COUNTED = ("p1", "p2", "rt")


def nat_unavailable() -> str | None:
    """Why the NAT tests cannot run here (None when they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    if shutil.which("nft") is None:
        return "needs nftables (apt-get install -y nftables) for the NAT namespace"
    return None


def _run(argv: Sequence[str], stdin: str | None = None) -> str:
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=20, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


class NatNet:
    """Builds the namespaces above; :meth:`close` deletes them (and what runs in them dies with its sockets)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.made: list[str] = []

    def ns(self, name: str) -> str:
        return f"gt-{self.tag}-{name}"

    def prefix(self, name: str) -> list[str]:
        """``ip netns exec`` prefix for a child started in namespace ``name``."""
        return ["ip", "netns", "exec", self.ns(name)]

    def _in(self, name: str, *argv: str) -> str:
        return _run(["ip", "netns", "exec", self.ns(name), *argv])

    def _veth(self, a: str, a_if: str, b: str, b_if: str) -> None:
        tmp_a, tmp_b = f"g{self.tag[-5:]}{a_if}"[:15], f"g{self.tag[-5:]}{b_if}x"[:15]
        _run(["ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b])
        for tmp, ns, name in ((tmp_a, a, a_if), (tmp_b, b, b_if)):
            _run(["ip", "link", "set", tmp, "netns", self.ns(ns)])
            _run(["ip", "-n", self.ns(ns), "link", "set", tmp, "name", name])
            _run(["ip", "-n", self.ns(ns), "link", "set", name, "up"])

    def setup(self) -> NatNet:
        self.close()
        for name in _NAMES:
            _run(["ip", "netns", "add", self.ns(name)])
            self.made.append(self.ns(name))
            _run(["ip", "-n", self.ns(name), "link", "set", "lo", "up"])
        self._veth("p1", "eth0", "rt", "r1")
        self._veth("p2", "eth0", "rt", "r2")
        self._veth("gw", "wan", "rt", "r3")
        self._veth("home", "eth0", "gw", "lan")
        self._veth("home2", "eth0", "gw", "lan2")
        addrs = [("p1", "eth0", "10.252.1.2/24"), ("p2", "eth0", "10.252.2.2/24"), ("rt", "r1", "10.252.1.1/24"),
                 ("rt", "r2", "10.252.2.1/24"), ("rt", "r3", "10.252.3.1/24"), ("gw", "wan", "10.252.3.2/24"),
                 ("gw", "lan", "192.168.77.1/24"), ("home", "eth0", "192.168.77.2/24"),
                 ("gw", "lan2", "192.168.78.1/24"), ("home2", "eth0", "192.168.78.2/24")]
        for ns, dev, cidr in addrs:
            _run(["ip", "-n", self.ns(ns), "addr", "add", cidr, "dev", dev])
        # a default route in the public namespaces: a dial to the home network's address leaves (and is counted)
        for ns, gw in (("p1", "10.252.1.1"), ("p2", "10.252.2.1"), ("gw", "10.252.3.1"), ("home", "192.168.77.1"),
                       ("home2", "192.168.78.1")):
            _run(["ip", "-n", self.ns(ns), "route", "add", "default", "via", gw])
        for ns in ("rt", "gw"):
            self._in(ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        _run(["ip", "netns", "exec", self.ns("gw"), "nft", "-f", "-"], stdin="""
table ip gtnat {
  chain postnat { type nat hook postrouting priority srcnat; oifname "wan" masquerade; }
  chain forwarding {
    type filter hook forward priority filter; policy drop;
    iifname { "lan", "lan2" } oifname "wan" accept;
    iifname "wan" oifname { "lan", "lan2" } ct state established,related accept;
  }
}
""")
        for ns in _COUNTED:
            _run(["ip", "netns", "exec", self.ns(ns), "nft", "-f", "-"], stdin=f"""
table inet gtcount {{
  counter private {{ }}
  chain outgoing {{ type filter hook output priority filter; ip daddr {HOME_NET} counter name private; }}
  chain forwarding {{ type filter hook forward priority filter - 1; ip daddr {HOME_NET} counter name private; }}
}}
""")
        return self

    def private_dials(self) -> dict[str, int]:
        """Packets each namespace sent or forwarded towards the home network's private addresses."""
        out = {}
        for ns in _COUNTED:
            data = json.loads(_run(["ip", "netns", "exec", self.ns(ns), "nft", "-j", "list", "counter", "inet",
                                    "gtcount", "private"]))
            (counter,) = [x["counter"] for x in data["nftables"] if "counter" in x]
            out[ns] = int(counter["packets"])
        return out

    def close(self) -> None:
        existing = _run(["ip", "netns", "list"]).split()
        for name in _NAMES:
            if self.ns(name) in existing:
                subprocess.run(["ip", "netns", "del", self.ns(name)], capture_output=True, timeout=20, check=False)
        self.made.clear()
