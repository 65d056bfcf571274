"""``geotrain dht``: run a bootstrap DHT node for a swarm.

Prints one JSON line ``{"event": "ready", "peer_id": ..., "maddrs": [...]}`` (what
other machines dial: ``--announce``, else the listening address, never 0.0.0.0) and
serves until SIGINT/SIGTERM, then shuts the node (and its ``p2pd``) down and
exits 0. Any hivemind DHT node works as a bootstrap too; this one also runs
geotrain's validators, so it refuses malformed, forged or pinned records.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from types import FrameType


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dht", help="run a bootstrap DHT node", description=__doc__)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)"
    )
    p.add_argument(
        "--port", type=int, default=0, help="TCP port (default 0: any free port, printed in the ready line)"
    )
    p.add_argument(
        "--identity",
        default=None,
        help="key file; created (0600) if missing; keeps the peer id across restarts",
    )
    p.add_argument(
        "--initial-peers", nargs="*", default=[], metavar="MADDR", help="other bootstrap nodes to join"
    )
    p.add_argument("--swarm", default="geotrain", help="swarm name (DHT key prefix); default geotrain")
    p.add_argument("--announce", default=None, metavar="HOST[,HOST...]",
                   help="addresses other machines dial (e.g. a cloud VM's public IP); needs a fixed --port. "
                        "Default: --host, or this machine's addresses when --host is 0.0.0.0")
    p.add_argument("--idle-connection", type=float, default=None, metavar="S",
                   help="close a connection unused for S seconds (0: never; default 60, the swarm config's)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from geotrain.cli import given
    from geotrain.swarm import Swarm, SwarmConfig
    from geotrain.swarm.identity import Identity
    from geotrain.transport.addresses import parse_host_list

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    config = SwarmConfig(
        initial_peers=tuple(args.initial_peers), host=args.host, port=args.port, swarm=args.swarm,
        announce=parse_host_list(args.announce), **given(idle_connection_s=args.idle_connection),
    )
    identity = Identity.load_or_create(args.identity) if args.identity else None
    with Swarm(config, identity=identity) as swarm:
        print(
            json.dumps({"event": "ready", "peer_id": swarm.peer_id, "maddrs": swarm.visible_maddrs()}),
            flush=True,
        )
        while not stop.wait(1.0):
            if not swarm.started:
                print(json.dumps({"event": "error", "error": "the DHT process died"}), flush=True)
                return 1
    print(json.dumps({"event": "stopped", "peer_id": swarm.peer_id}), flush=True)
    return 0
