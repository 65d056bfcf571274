"""Test seams for the swarm tests: a bare hivemind client (the attacker) and /proc look-ups."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from geotrain.swarm.identity import Identity


class RawClient:
    """A bare ``hivemind.DHTNode`` with no validators and no geotrain code in its path.

    It plays a malicious or careless member: it sends hand-built store requests
    straight to one node, so the test sees that node's own verdict.
    """

    def __init__(self, initial_peers: list[str], identity: Identity | None = None) -> None:
        from hivemind.dht.node import DHTNode

        self.identity = identity or Identity.ephemeral()
        self.loop = asyncio.new_event_loop()
        self.node = self.loop.run_until_complete(
            asyncio.wait_for(
                DHTNode.create(
                    initial_peers=initial_peers,
                    client_mode=True,
                    host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                    wait_timeout=3,
                ),
                60,
            )
        )

    @property
    def owner_subkey(self) -> bytes:
        return b"[owner:" + self.identity.owner_public_key() + b"]"

    def signed(self, key: str, subkey: bytes, value: object, expiration: float) -> tuple[bytes, bytes]:
        """(subkey bytes, value bytes) signed with this client's own key, as an honest node would sign."""
        from hivemind.dht.crypto import RSASignatureValidator
        from hivemind.dht.routing import DHTID
        from hivemind.dht.validation import DHTRecord
        from hivemind.utils import MSGPackSerializer

        subkey_bytes = MSGPackSerializer.dumps(subkey)
        value_bytes = value if isinstance(value, bytes) else MSGPackSerializer.dumps(value)
        record = DHTRecord(DHTID.generate(source=key).to_bytes(), subkey_bytes, value_bytes, expiration)
        signer = RSASignatureValidator(self.identity.hivemind_private_key())
        return subkey_bytes, signer.sign_value(dataclasses.replace(record))

    def raw_store(
        self, peer_id: str, key: str, subkey_bytes: bytes, value_bytes: bytes, expiration: float
    ) -> bool:
        """Ask ``peer_id`` to store exactly these bytes; returns that node's store_ok."""
        from hivemind.dht.routing import DHTID
        from hivemind.p2p import PeerID
        from hivemind.proto import dht_pb2

        request = dht_pb2.StoreRequest(
            keys=[DHTID.generate(source=key).to_bytes()],
            subkeys=[subkey_bytes],
            values=[value_bytes],
            expiration_time=[expiration],
            in_cache=[False],
            peer=self.node.protocol.node_info,
        )
        stub = self.node.protocol.get_stub(PeerID.from_base58(peer_id))
        response = self.loop.run_until_complete(asyncio.wait_for(stub.rpc_store(request, timeout=10), 15))
        (ok,) = response.store_ok
        return bool(ok)

    def close(self) -> None:
        self.loop.run_until_complete(asyncio.wait_for(self.node.shutdown(), 15))
        self.loop.close()


def nested_list_value(levels: int) -> Any:
    deep: Any = 1
    for _ in range(levels):
        deep = [deep]
    return deep


def nested_tuple_bytes(levels: int) -> bytes:
    """hivemind's encoding of ``levels`` nested tuples: ~300 of them crash an unguarded decoder."""
    import msgpack

    b = msgpack.packb(1)
    for _ in range(levels):
        b = msgpack.packb(msgpack.ExtType(0x40, b"\x91" + b))
    return b


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something truthy; raise TimeoutError past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)


def session_pids(sid: int) -> set[int]:
    """Live processes in session ``sid`` (a ChildGroup child, its DHT process and its p2pd)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            pids.add(int(entry.name))
    return pids


def listening_tcp_ports(pids: set[int]) -> set[int]:
    """TCP ports in LISTEN state owned by any of ``pids``."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def dead_maddr() -> str:
    """A multiaddr where nobody listens: a port the kernel just handed out and took back."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"/ip4/127.0.0.1/tcp/{port}/p2p/{Identity.ephemeral().peer_id}"
