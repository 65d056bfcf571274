"""``geotrain peer``: join a swarm and train whatever stage the plan gives this peer.

Prints JSON lines: ``{"event": "ready", "peer_id", "region", "endpoint", "maddrs", "tflops", ...}``
once joined, then events (``links``, ``plan``, ``stalled``, ``done``, ``stopped``).
SIGINT/SIGTERM stop it cleanly (its DHT process and ``p2pd`` with it).

``--emulate SCENARIO`` adds the scenario's one-way delay (and, with
``--emulate-bandwidth``, its bandwidth) to every message this peer sends to
another region: link emulation for trying multi-region jobs on one machine.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("peer", help="join a swarm and train", description=__doc__)
    p.add_argument("--initial-peers", nargs="+", required=True, metavar="MADDR", help="bootstrap multiaddrs")
    p.add_argument("--region", required=True, help="this peer's region label, e.g. eu-west")
    p.add_argument("--price", type=float, default=0.0, metavar="USD_PER_HOUR", help="what this peer costs per hour")
    p.add_argument("--identity", default=None, help="key file (created if missing) so a restart keeps the peer id")
    p.add_argument("--host", default="127.0.0.1", help="address for the DHT and the data plane (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="data-plane port (default 0: any free port)")
    p.add_argument("--streams", type=int, default=None, metavar="K",
                   help="TCP connections to each peer in another region; messages of 1 MiB or more are split "
                        "over them, so one connection's window does not cap a long fat link (default 4)")
    p.add_argument("--dht-port", type=int, default=0, help="DHT (libp2p) port (default 0: any free port)")
    p.add_argument("--announce", default=None, metavar="HOST[,HOST...]",
                   help="addresses other machines dial (data plane and DHT), e.g. a cloud VM's public IP; "
                        "default: the --host address, or this machine's addresses when --host is 0.0.0.0")
    p.add_argument("--nat", action="store_true",
                   help="this machine accepts no inbound connections (home router, lab firewall): DHT client "
                        "mode with relays, and the data plane dials out to the peers it exchanges with")
    p.add_argument("--client-mode", action="store_true",
                   help="DHT client mode only (no inbound DHT connections); the data plane is left to the "
                        "reachability check, which makes it dial out if nobody can dial it")
    p.add_argument("--no-relay", action="store_true", help="never use libp2p circuit relays for the DHT")
    p.add_argument("--swarm", default="geotrain", help="swarm name (DHT key prefix)")
    p.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:N, auto")
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                   help="N local ranks, one peer: --device cuda gives one rank per GPU (NCCL), --device cpu N "
                        "gloo ranks; each computes a share of every microbatch")
    p.add_argument("--devices", default=None, metavar="DEV[,DEV...]",
                   help="the local ranks' devices, e.g. cuda:0,cuda:1,cuda:2,cuda:3 (one rank each)")
    p.add_argument("--job", default=None, help="follow only this job id (default: the newest job)")
    p.add_argument("--heartbeat", type=float, default=30.0, metavar="S",
                   help="period of the peer record's heartbeat (it expires after 3); in a job the peer also "
                        "republishes its progress every job swarm.heartbeat_s (or S, when shorter)")
    p.add_argument("--probe-every", type=float, default=3600.0, metavar="S",
                   help="re-measure each probed link this often (bulk transfers of a few MiB; default hourly)")
    p.add_argument("--idle-connection", type=float, default=None, metavar="S",
                   help="close a DHT (libp2p) connection unused for S seconds (0: never; default 60, the swarm config's)")
    p.add_argument("--emulate", default=None, metavar="SCENARIO", help="emulate the scenario's inter-region delays")
    p.add_argument("--emulate-bandwidth", action="store_true", help="with --emulate: also shape bandwidth in the transport")
    p.add_argument("--emulate-scale", type=float, default=1.0, help="divide emulated bandwidths by this")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="this peer's copy of the job's data: relative data paths are read under DIR")
    p.add_argument("--model-dir", default=None, metavar="DIR",
                   help="this peer's copy of the job's pretrained weights (model.hf_pretrained) under DIR")
    p.add_argument("--state-dir", default=None, metavar="DIR",
                   help="where this peer keeps its checkpoints of the blocks it holds "
                        "(default ~/.cache/geotrain/state/<peer id>)")
    p.add_argument("--swarm-key", default=None, metavar="FILE",
                   help="swarm key (geotrain keygen): admit only members; CURVE-encrypt the data plane")
    p.set_defaults(handler=_run)


#: seconds the join-time reachability check of a closed swarm's member waits for a helper (see ``_run``)
CLOSED_JOIN_ASK_S = 3.0


def load_admission(path: str | None) -> Any:
    """The swarm-key admission of this process, or None for an open swarm."""
    if path is None:
        return None
    from geotrain.swarm.admission import Admission
    from geotrain.swarm.keys import load_swarm_key

    return Admission(load_swarm_key(path))


def _dht_port(swarm: Any) -> int:
    maddrs = swarm.visible_maddrs()
    return int(maddrs[0].split("/")[4]) if maddrs else swarm.config.port


def _emit(event: dict[str, Any]) -> None:
    print(json.dumps(event, default=str), flush=True)


def _run(args: argparse.Namespace) -> int:
    import torch

    from geotrain.cli import given
    from geotrain.errors import ConfigError, GeotrainError
    from geotrain.peers.agent import AgentConfig, PeerAgent
    from geotrain.peers.ranks import resolve_devices
    from geotrain.swarm import Swarm, SwarmConfig
    from geotrain.swarm.identity import Identity
    from geotrain.transport import Transport, TransportConfig

    try:
        devices = resolve_devices(args.device, args.nproc_per_node, args.devices)
    except ConfigError as e:
        print(f"geotrain peer: error: {e}", file=sys.stderr)
        return 2
    rank_threads = args.threads
    if len(devices) > 1 and devices[0] == "cpu" and not args.threads:
        import os

        rank_threads = max(1, (os.cpu_count() or 1) // len(devices))  # N ranks share the cores
    if rank_threads:
        torch.set_num_threads(rank_threads)
    stop = threading.Event()
    agent_ref: list[PeerAgent] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
        for a in agent_ref:
            a.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    emulator = None
    if args.emulate:
        from geotrain.emulate import LinkEmulator, LinkEmulatorConfig, load_topology

        topo = load_topology(args.emulate)
        emulator = LinkEmulator(
            LinkEmulatorConfig.from_topology(
                topo, args.region, scale=args.emulate_scale, shape_bandwidth=args.emulate_bandwidth
            )
        )
    identity = Identity.load_or_create(args.identity) if args.identity else None
    from geotrain.transport.addresses import parse_host_list

    announce = parse_host_list(args.announce)
    config = SwarmConfig(
        initial_peers=tuple(args.initial_peers), host=args.host, swarm=args.swarm, heartbeat_s=args.heartbeat,
        port=args.dht_port, announce=announce, client_mode=args.nat or args.client_mode, use_relay=not args.no_relay,
        use_auto_relay=args.nat, **given(idle_connection_s=args.idle_connection),
    )
    admission = load_admission(args.swarm_key)
    curve = admission.curve_config() if admission is not None else None
    transport_config = TransportConfig(host=args.host, port=args.port, curve=curve, announce=announce,
                                       dial_out=args.nat, **given(streams=args.streams))
    with Swarm(config, identity=identity, admission=admission) as swarm:
        transport = Transport(transport_config, peer_id=swarm.peer_id, region=args.region, emulator=emulator).start()
        try:
            agent = PeerAgent(
                AgentConfig(region=args.region, usd_per_hour=args.price, device=args.device, job_id=args.job,
                            devices=devices, rank_threads=rank_threads,
                            probe_every_s=args.probe_every, data_dir=args.data_dir, model_dir=args.model_dir,
                            state_dir=args.state_dir or str(Path.home() / ".cache" / "geotrain" / "state" /
                                                            swarm.peer_id)),
                swarm=swarm,
                transport=transport,
                emit=_emit,
            )
            agent_ref.append(agent)
            if stop.is_set():
                return 0
            from geotrain.peers.reachability import (
                ReachabilityConfig,
                ReachabilityMonitor,
                reachability_event,
                run_preflight,
            )

            def on_reach(result: Any) -> None:
                _emit(reachability_event(result, transport=transport, dht_port=_dht_port(swarm),
                                         dht_maddrs=swarm.visible_maddrs(), client_mode=config.client_mode))

            # before the record is first published; in a closed swarm no member admits this peer's key before
            # that (unless a record of this identity is still live), so it asks briefly and the monitor asks again
            # once the record is out, instead of the join waiting out a whole request timeout
            first = ReachabilityConfig(request_timeout_s=CLOSED_JOIN_ASK_S) if swarm.admission is not None else None
            on_reach(run_preflight(transport, swarm, region=args.region, config=first))
            ReachabilityMonitor(transport, swarm, region=args.region, on_result=on_reach).start()
            record = agent.start()
            _emit({
                "event": "ready",
                "peer_id": swarm.peer_id,
                "region": args.region,
                "endpoint": transport.address,
                "endpoints": list(transport.endpoints),
                "reachable": transport.reachable,
                "maddrs": swarm.visible_maddrs(),
                "tflops": record.flops / 1e12,
                "device": record.device,
                "local_ranks": agent.local_rank_pids(),  # the helper ranks' process ids (--nproc-per-node)
                "emulated": bool(emulator),
                "admission": admission is not None,
            })
            code = agent.run()
        except GeotrainError as e:
            print(f"geotrain peer: error: {e}", file=sys.stderr)
            return 2
        finally:
            transport.close()
    _emit({"event": "stopped", "peer_id": config and swarm.peer_id})
    return code
