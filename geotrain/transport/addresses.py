"""Bound addresses, announced addresses, and the interfaces' own addresses.

Words: a peer **binds** a socket on a local address (``--host``; ``0.0.0.0``
or ``::`` mean every interface) and **announces** the addresses other peers
should dial (``--announce``). They differ behind 1:1 NAT (a cloud VM's public
IP is on no interface) and whenever a peer binds every interface. An
**unspecified** address (``0.0.0.0``, ``::``) is never announced: nobody can
dial it. A peer bound to one without ``--announce`` announces its interfaces'
addresses instead, non-loopback first.

A **dial-back** peer (:data:`DIAL_BACK`) accepts no inbound connections (it is
behind NAT or a firewall): it publishes :data:`DIAL_BACK` as its endpoint, dials
out to every peer it exchanges with, and those peers answer over the
connection it opened.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import shutil
import socket
import subprocess

from geotrain.errors import ConfigError

logger = logging.getLogger(__name__)

#: The endpoint a peer that cannot be dialled publishes: "dial me back over my own connection".
DIAL_BACK = "dialback://"

_HOST_PORT_RE = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+))(?::(?P<port>[0-9]{1,5}))?$")


def is_unspecified(host: str) -> bool:
    """True for ``0.0.0.0``, ``::`` (and ``*``, ZMQ's word for every interface)."""
    if host in ("*", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False  # a DNS name: resolved by whoever dials it


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def tcp_endpoint(host: str, port: int) -> str:
    """``tcp://host:port``, brackets around an IPv6 address."""
    host = host.strip("[]")
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``tcp://host:port`` -> (host, port); ConfigError for anything else."""
    if not endpoint.startswith("tcp://"):
        raise ConfigError(f"endpoint {endpoint!r} must look like tcp://HOST:PORT")
    host, sep, port = endpoint[len("tcp://"):].rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"endpoint {endpoint!r} must look like tcp://HOST:PORT")
    return host.strip("[]"), int(port)


def parse_announce(text: str | None) -> tuple[str, ...]:
    """``--announce HOST[:PORT][,HOST[:PORT]...]`` -> a tuple of ``HOST`` or ``HOST:PORT`` items.

    An item without a port takes the bound port (1:1 NAT keeps ports); with one, it names a
    forwarded port. Unspecified addresses are refused: nobody can dial them.
    """
    if not text:
        return ()
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        m = _HOST_PORT_RE.match(item)
        if m is None:
            raise ConfigError(f"--announce item {item!r} must be HOST or HOST:PORT (IPv6 as [ADDR] or [ADDR]:PORT)")
        host = m.group("v6") or m.group("host")
        if is_unspecified(host):
            raise ConfigError(f"--announce {item!r}: an unspecified address cannot be dialled; give the address "
                              "other machines reach this one at (its public IP, or its LAN address)")
        port = m.group("port")
        if port is not None and not 0 < int(port) <= 65535:
            raise ConfigError(f"--announce {item!r}: port must be in 1..65535")
        out.append(item)
    return tuple(out)


def announce_host_port(item: str, default_port: int) -> tuple[str, int]:
    """One :func:`parse_announce` item -> (host, port), the port defaulting to ``default_port``."""
    m = _HOST_PORT_RE.match(item)
    if m is None:
        raise ConfigError(f"announce item {item!r} must be HOST or HOST:PORT")
    host = m.group("v6") or m.group("host")
    port = m.group("port")
    return host, int(port) if port is not None else default_port


def interface_addresses(*, family: int | None = None) -> list[str]:
    """This machine's interface addresses, non-loopback first, link-local IPv6 left out.

    Read from ``ip -j addr`` when iproute2 is installed, else from the kernel
    (``/proc/net/if_inet6`` and an ``SIOCGIFADDR`` per interface).
    """
    addrs = _from_iproute() or _from_kernel()
    out = []
    for a in addrs:
        try:
            ip = ipaddress.ip_address(a)
        except ValueError:
            continue
        if ip.is_link_local or ip.is_unspecified:
            continue
        if family == socket.AF_INET and ip.version != 4 or family == socket.AF_INET6 and ip.version != 6:
            continue
        out.append(a)
    # stable order: non-loopback before loopback, IPv4 before IPv6, else as the kernel lists them
    return sorted(dict.fromkeys(out), key=lambda a: (is_loopback(a), ":" in a))


def _from_iproute() -> list[str]:
    ip = shutil.which("ip")
    if ip is None:
        return []
    try:
        done = subprocess.run([ip, "-j", "addr"], capture_output=True, text=True, timeout=5.0, check=False)
        data = json.loads(done.stdout) if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return []
    out = []
    for iface in data:
        if "UP" not in iface.get("flags", ["UP"]):
            continue
        for info in iface.get("addr_info", []):
            if isinstance(info.get("local"), str):
                out.append(info["local"])
    return out


def _from_kernel() -> list[str]:
    import fcntl
    import struct

    out = []
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            out.append(socket.inet_ntoa(packed[20:24]))
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                raw = line.split()[0]
                out.append(str(ipaddress.ip_address(bytes.fromhex(raw))))
    except OSError:
        pass
    return out


def advertised_endpoints(bound: str, announce: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What a socket bound at ``bound`` (``tcp://host:port``, port read back) publishes.

    ``announce`` (from :func:`parse_announce`) wins; else the bound address, unless it is
    unspecified: then the interfaces' addresses of the same family, non-loopback first.
    """
    host, port = split_endpoint(bound)
    if announce:
        return tuple(tcp_endpoint(*announce_host_port(a, port)) for a in announce)
    if not is_unspecified(host):
        return (tcp_endpoint(host, port),)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    hosts = interface_addresses(family=family) or (["::1"] if family == socket.AF_INET6 else ["127.0.0.1"])
    logger.info("bound to %s without --announce: publishing this machine's addresses %s (set --announce to "
                "publish another, e.g. a public IP)", bound, ", ".join(hosts))
    return tuple(tcp_endpoint(h, port) for h in hosts)


def parse_host_list(text: str | None) -> tuple[str, ...]:
    """The CLI's ``--announce HOST[,HOST...]``: hosts only (ports come from --port and --dht-port)."""
    items = parse_announce(text)
    for item in items:
        host, port = announce_host_port(item, 0)
        if port:
            raise ConfigError(f"--announce {item!r}: give hosts only; the ports are --port (data plane) and "
                              "--dht-port (DHT)")
    return items
