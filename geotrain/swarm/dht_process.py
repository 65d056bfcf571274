"""hivemind's DHT process, made to die with its parent and take ``p2pd`` along.

``hivemind.DHT`` runs its node in a forked child, which in turn runs the Go
``p2pd`` daemon. If the parent is killed (SIGKILL), nothing tells the child; if
the child is killed with SIGTERM, its default action skips hivemind's cleanup
and leaves ``p2pd`` orphaned. :class:`SwarmDHT` closes both gaps on Linux:

- the child asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``);
- on SIGTERM the child terminates ``p2pd`` itself before exiting.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Collection, Iterable, Mapping
from types import FrameType
from typing import Any

from hivemind import DHT

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class SwarmDHT(DHT):
    """A ``hivemind.DHT`` whose process (and its ``p2pd``) never outlives the process that started it."""

    def run(self) -> None:
        _set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != self._parent_pid:  # the parent died before prctl took effect
            os._exit(1)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        super().run()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        node: Any = getattr(self, "_node", None)
        child = getattr(getattr(node, "p2p", None), "_child", None)
        pid = getattr(child, "pid", None)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        os._exit(128 + signum)


async def p2pd_pid(_dht: DHT, node: Any) -> int | None:
    """(Runs inside the DHT process, via ``DHT.run_coroutine``.) The pid of its ``p2pd``."""
    child = getattr(getattr(node, "p2p", None), "_child", None)
    return getattr(child, "pid", None)


def terminate_p2pd(pid: int) -> bool:
    """SIGTERM ``pid`` if it is still a running ``p2pd`` (the cmdline check guards against pid reuse)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"p2pd" not in f.read().split(b"\0", 1)[0]:
                return False
        os.kill(pid, signal.SIGTERM)
    except (OSError, ProcessLookupError):
        return False
    logger.warning("terminated an orphaned p2pd (pid %d) whose DHT process had died", pid)
    return True


#: (Inside the DHT process.) key id -> (when found, the key's num_replicas nearest nodes, nearest first: a
#: peer, or None for this node), for direct writes.
_REPLICAS: dict[Any, tuple[float, list[Any]]] = {}
#: (Inside the DHT process.) Writes to replicas still under way after their store returned (kept referenced).
_STRAGGLERS: set[Any] = set()


def _stored(task: Any) -> bool:
    """Whether one replica's ``call_store`` task took the record (a list of one bool per record, None on failure)."""
    if task.cancelled() or task.exception() is not None:
        return False
    result = task.result()
    return result is not None and len(result) > 0 and bool(result[0])


async def store_direct(
    _dht: DHT, node: Any, *, key: Any, subkey: Any, value: Any, expiration: float, refresh_s: float, beam: int,
    replicas: int | None = None,
) -> bool:
    """(Runs inside the DHT process, via ``DHT.run_coroutine``.) Store one signed subkey record, quietly.

    hivemind's ``store`` first looks the key's nearest nodes up, and every node a lookup asks answers with
    the key's whole value: for a dictionary of N records (the peers, their progress) each write then
    moves O(N) bytes from several nodes. This writes straight to the replicas a lookup found earlier (one
    lookup per ``refresh_s``, or when fewer than a majority of them took the record), so a heartbeat costs its
    own record times the replicas, whatever N is; that lookup asks for the key's sibling id, whose nearest
    nodes are the key's own but hold no value, so it too moves O(1) bytes.

    ``replicas``: how many of the key's nearest nodes take the record (default and most: hivemind's
    ``num_replicas``, 5), this node included when it is one of them. The write is done once a majority of
    them (3 of 5, 2 of 3; this node's own copy counts, but one other copy at least) took it; the rest finish
    in the background.
    """
    import asyncio
    import dataclasses
    import time

    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord

    key_id = DHTID.generate(source=key)
    now = time.monotonic()
    protocol = node.protocol
    known = _REPLICAS.get(key_id)
    if known is None or now - known[0] > refresh_s or not known[1]:
        # looked up by the key's sibling id (its last bit flipped): the same nearest nodes (two node ids that
        # agree on 159 bits never occur), but no node stores a value under it, so none answers with the key's
        # whole dictionary (hivemind's find answers every asked node's stored value, and drops it)
        sibling = DHTID(int(key_id) ^ 1)
        found = await node.find_nearest_nodes([sibling], k_nearest=node.num_replicas, beam_size=beam,
                                              exclude_self=True)
        nearest = dict(found.get(sibling, {}))
        # a full node (not client mode) among the key's nearest is one of its replicas, as in hivemind's
        # own store: it keeps the record too (else readers that ask it get the others' records without its own)
        candidates = sorted([*nearest, *([] if protocol.client_mode else [node.node_id])], key=key_id.xor_distance)
        # nearest first; None stands for this node
        known = (now, [nearest.get(n) for n in candidates[: node.num_replicas]])
        _REPLICAS[key_id] = known
    # a record with fewer replicas goes to the nearest ones: those a quick read asks first
    want = node.num_replicas if replicas is None else max(1, min(replicas, node.num_replicas))
    chosen = known[1][:want]
    here = None in chosen
    targets = [p for p in chosen if p is not None]
    if not targets and not here:  # alone in the swarm: keep it here, as hivemind's own store would
        return bool(await node.store(key, value, expiration, subkey=subkey))
    record = DHTRecord(key_id.to_bytes(), protocol.serializer.dumps(subkey), protocol.serializer.dumps(value),
                       expiration)
    if protocol.record_validator is not None:
        record = dataclasses.replace(record, value=protocol.record_validator.sign_value(record))
    stored_here = 0
    if here and (protocol.record_validator is None or protocol.record_validator.validate(record)):
        stored_here = int(bool(protocol.storage.store(key_id, record.value, expiration, subkey=subkey)))
    # done once a majority of the replicas took it, this node's own copy counted, and one other at least (a copy
    # here alone dies with this node): a replica behind a congested link (the very link a pipeline is
    # saturating) finishes in the background, bounded by hivemind's RPC timeout, instead of holding up the
    # heartbeat until the record it renews has expired
    need = min(len(targets), max(1, want // 2 + 1 - stored_here))
    pending = {asyncio.ensure_future(protocol.call_store(peer, keys=[key_id], values=[record.value],
                                                          expiration_time=[expiration], subkeys=[subkey]))
               for peer in targets}
    ok = 0
    while pending and ok < need:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        ok += sum(1 for t in done if _stored(t))
    for t in pending:
        _STRAGGLERS.add(t)
        t.add_done_callback(_STRAGGLERS.discard)
    if ok < need:
        _REPLICAS.pop(key_id, None)  # a replica left or refused: look the key up again next time
    return ok + stored_here > 0


#: (Inside the DHT process.) Connections closed for idleness so far (read by :func:`idle_closer_stats`).
_IDLE_CLOSED: list[int] = [0]


def idle_connections(connected: Iterable[Any], last_used: Mapping[Any, float], *, now: float, since: float,
                     idle_s: float, keep: Collection[Any] = ()) -> list[Any]:
    """The connected peers this node's DHT has not talked to for ``idle_s`` (never: since ``since``).

    ``keep`` (the initial peers) are never named: a node's way back into the swarm stays open.
    """
    return [p for p in connected if p not in keep and now - last_used.get(p, since) > idle_s]


async def close_idle_connections(_dht: DHT, node: Any, *, idle_s: float, period_s: float,
                                  keep: Collection[str] = ()) -> None:
    """(Runs inside the DHT process, via ``DHT.run_coroutine``, until the node stops.) Close idle connections.

    libp2p keeps every connection a node ever opened (its connection manager trims none below 512), and
    each costs keep-alives and upkeep, ~20-40 B/s on the wire while unused. In a swarm of a few dozen
    nodes every node ends up connected to every other, though an idle peer only talks to a handful (its
    keys' replicas). Every DHT request, in or out, passes hivemind's routing-table update: wrapped here
    to note when this node last talked to each peer. A connection unused for ``idle_s`` is closed; the
    next request to that peer dials it again (libp2p finds its addresses), so nothing but a dial is lost.
    """
    import asyncio
    import time

    from hivemind.p2p import PeerID

    last_used: dict[Any, float] = {}
    protocol = node.protocol
    update = protocol.update_routing_table

    async def noting_use(node_id: Any, peer_id: Any, responded: bool = True) -> None:
        last_used[peer_id] = time.monotonic()
        return await update(node_id, peer_id, responded)

    protocol.update_routing_table = noting_use
    kept = {PeerID.from_base58(k) for k in keep}
    since = time.monotonic()
    client = node.p2p._client
    while getattr(node, "is_alive", True):
        await asyncio.sleep(period_s)
        try:
            connected = [info.peer_id for info in await client.list_peers()]
            now = time.monotonic()
            for peer in idle_connections(connected, last_used, now=now, since=since, idle_s=idle_s, keep=kept):
                await client.disconnect(peer)
                _IDLE_CLOSED[0] += 1
            for peer in [p for p, t in last_used.items() if now - t > idle_s]:  # gone or closed: forget them
                del last_used[peer]
        except Exception as e:  # the daemon is stopping, or one call failed: try again next period
            logger.debug("closing idle connections: %s", e)


async def idle_closer_stats(_dht: DHT, node: Any) -> dict[str, int]:
    """(Runs inside the DHT process.) Connections open now and closed for idleness so far."""
    return {"connected": len(await node.p2p._client.list_peers()), "closed": _IDLE_CLOSED[0]}
