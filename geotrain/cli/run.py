"""``geotrain run JOB.toml --initial-peers MADDR``: the coordinator of one job.

Publishes the job (signed), waits for ``swarm.min_peers`` peers, plans from
their measured compute and links, publishes the plan, shows a live view,
replans on churn and writes the report (``report.json`` + PNG plots) into
``--report-dir`` (default ``runs/<job id>``). With ``--json`` every event is a
JSON line instead of the live view; the last one is ``{"event": "report", ...}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="launch a job on a swarm and report", description=__doc__)
    p.add_argument("job", help="job file (TOML); see docs/job.md")
    p.add_argument("--initial-peers", nargs="+", required=True, metavar="MADDR", help="bootstrap multiaddrs")
    p.add_argument("--job-id", default=None, help="job id (default: <job.name>-<time>); reuse it to reattach")
    p.add_argument("--identity", default=None, help="key file; reuse it to reattach after a restart")
    p.add_argument("--report-dir", default=None, help="where report.json and plots go (default runs/<job id>)")
    p.add_argument("--host", default="127.0.0.1", help="address for the DHT and data plane")
    p.add_argument("--port", type=int, default=0, help="data-plane port (default 0: any free port)")
    p.add_argument("--dht-port", type=int, default=0, help="DHT (libp2p) port (default 0: any free port)")
    p.add_argument("--announce", default=None, metavar="HOST[,HOST...]",
                   help="addresses peers dial to reach the coordinator (data plane and DHT), e.g. a public IP")
    p.add_argument("--nat", action="store_true",
                   help="this machine accepts no inbound connections: DHT client mode, dial-out data plane")
    p.add_argument("--swarm", default="geotrain", help="swarm name (DHT key prefix)")
    p.add_argument("--egress", type=parse_egress, default={"*": 0.02}, metavar="USD_PER_GB|REGION=USD,...",
                   help="USD per GB leaving a region: one price for all (default 0.02), or per region, e.g. "
                        "us-east=0.02,ap-south=0.08,*=0.05 (* = regions not named)")
    p.add_argument("--swarm-key", default=None, metavar="FILE", help="swarm key of a closed swarm (geotrain keygen)")
    p.add_argument("--resume", default=None, nargs="?", const="", metavar="DIR",
                   help="continue from the newest checkpoint: with DIR, the newest complete one in that shared "
                        "directory (and keep checkpointing there); alone, the newest manifest in --report-dir "
                        "(same --job-id), the peers holding the state")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics (0: any free port)")
    p.add_argument("--full-read-every", type=_seconds, default=60.0, metavar="SECONDS",
                   help="read every peer's own progress record at least this often (default 60); between, the "
                        "watch reads one progress digest per region. 0: every tick (the digests are not used)")
    p.add_argument("--json", action="store_true", help="JSON lines instead of the live view")
    p.set_defaults(handler=_run)


def _seconds(text: str) -> float:
    try:
        x = float(text)
        if not x >= 0 or x == float("inf"):
            raise ValueError(x)
        return x
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0; got {text!r}") from None


def parse_egress(text: str) -> dict[str, float]:
    """``--egress``: one price (``"0.02"``) for every region, or ``REGION=USD`` pairs (``*`` for the rest)."""
    try:
        if "=" not in text:
            return {"*": _price(float(text))}
        out: dict[str, float] = {}
        for part in text.split(","):
            region, _, price = part.partition("=")
            if not region.strip() or not price:
                raise ValueError(part)
            out[region.strip()] = _price(float(price))
        return out
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--egress takes a price in USD per GB (0.02) or REGION=USD pairs (us-east=0.02,*=0.05); got {text!r}"
        ) from None


def _price(x: float) -> float:
    if not x >= 0:  # also refuses NaN
        raise ValueError(x)
    return x


def run_coordinator(
    job_path: str | Path | None,
    *,
    initial_peers: list[str],
    job_id: str | None = None,
    identity_path: str | None = None,
    report_dir: str | Path | None = None,
    host: str = "127.0.0.1",
    swarm_name: str = "geotrain",
    egress_usd_per_gb: float | dict[str, float] = 0.02,
    emit: Any = None,
    stop: threading.Event | None = None,
    job: Any = None,
    resume: str | Path | None = None,
    swarm_key: str | Path | None = None,
    port: int = 0,
    dht_port: int = 0,
    announce: str | None = None,
    nat: bool = False,
    full_read_every_s: float = 60.0,
) -> dict[str, Any]:
    """Run one job to its end and return the report (used by ``geotrain run`` and ``geotrain demo``)."""
    from geotrain.config import load_job
    from geotrain.coordinator import Coordinator, CoordinatorConfig
    from geotrain.swarm import Swarm, SwarmConfig
    from geotrain.swarm.identity import Identity
    from geotrain.transport import Transport, TransportConfig

    if job is None and job_path is None:
        raise ValueError("run_coordinator needs a job file path or a JobSpec")
    from geotrain.coordinator.prepare import prepare_job

    spec = job if job is not None else load_job(job_path)  # type: ignore[arg-type]
    # every check `geotrain check` makes, before anything is published; peers get the resolved job
    spec = prepare_job(spec).job
    if resume:  # "" (a bare --resume): from the swarm, by the manifest in the report directory
        spec = dataclasses.replace(spec, checkpoint=dataclasses.replace(spec.checkpoint, dir=str(resume)))
    job_id = job_id or f"{spec.job.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(report_dir) if report_dir else Path(spec.report.dir) / job_id
    identity = Identity.load_or_create(identity_path) if identity_path else None
    from geotrain.transport.addresses import parse_host_list

    hosts = parse_host_list(announce)
    config = SwarmConfig(initial_peers=tuple(initial_peers), host=host, swarm=swarm_name, port=dht_port,
                         announce=hosts, client_mode=nat, use_auto_relay=nat)
    from geotrain.cli.peer import load_admission

    admission = load_admission(str(swarm_key) if swarm_key else None)
    with Swarm(config, identity=identity, admission=admission) as swarm:
        curve = admission.curve_config() if admission is not None else None
        transport = Transport(TransportConfig(host=host, port=port, curve=curve, announce=hosts, dial_out=nat),
                              peer_id=swarm.peer_id, region="coordinator").start()
        from geotrain.peers.reachability import serve_dialback

        serve_dialback(transport)  # joining peers may ask the coordinator to check their reachability
        try:
            coord = Coordinator(
                CoordinatorConfig(job_id=job_id, report_dir=out, resume=resume is not None,
                                  full_read_every_s=full_read_every_s,
                                  egress_usd_per_gb=egress_usd_per_gb if isinstance(egress_usd_per_gb, dict)
                                  else {"*": egress_usd_per_gb}),
                spec,
                swarm=swarm,
                transport=transport,
                emit=emit,
            )
            if stop is not None:

                def relay() -> None:
                    stop.wait()
                    coord.stop()

                threading.Thread(target=relay, daemon=True).start()
            return coord.run()
        finally:
            transport.close()


def _run(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    kwargs: dict[str, Any] = dict(
        initial_peers=args.initial_peers, job_id=args.job_id, identity_path=args.identity,
        report_dir=args.report_dir, host=args.host, swarm_name=args.swarm, egress_usd_per_gb=args.egress, stop=stop,
        resume=args.resume, swarm_key=args.swarm_key, port=args.port, dht_port=args.dht_port,
        announce=args.announce, nat=args.nat, full_read_every_s=args.full_read_every,
    )
    metrics = None
    if args.metrics_port is not None:
        from geotrain.coordinator.metrics import MetricsServer

        metrics = MetricsServer(port=args.metrics_port).start()
    try:
        if args.json:
            def emit(e: dict[str, Any]) -> None:
                print(json.dumps(e, default=str), flush=True)
                if metrics is not None:
                    metrics(e)

            if metrics is not None:
                emit({"event": "metrics", "url": metrics.address})
            report = run_coordinator(args.job, emit=emit, **kwargs)
        else:
            from geotrain.coordinator.live import LiveView

            with LiveView() as view:
                if metrics is not None:
                    view({"event": "start", "metrics": metrics.address})

                def fan(e: dict[str, Any]) -> None:
                    view(e)
                    if metrics is not None:
                        metrics(e)

                report = run_coordinator(args.job, emit=fan, **kwargs)
            print_summary(report)
    finally:
        if metrics is not None:
            metrics.close()
    return 0 if report["summary"].get("val_loss_final") is not None or report["loss"] else 1


def print_summary(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = report["summary"]
    t = Table(title=f"job {s['job_id']}: summary")
    t.add_column("figure")
    t.add_column("value", justify="right")

    def fmt(key: str, v: Any) -> str:
        if v is None:
            return "-"
        if "bytes" in key:
            return f"{v / 1e6:,.2f} MB"
        if key.startswith("usd"):
            return f"${v:,.4f}"
        if isinstance(v, float):
            return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    for k, v in s.items():
        t.add_row(k, fmt(k, v))
    Console().print(t)
