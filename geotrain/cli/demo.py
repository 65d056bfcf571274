"""``geotrain demo``: a whole region-spanning job on this machine, ending with a report.

Starts a bootstrap DHT node and ``--peers`` peers spread over three emulated
regions (child processes on loopback), trains a tiny Llama (a ``transformers``
model built from a local config) with a byte-level BPE tokenizer trained on the
embedded corpus (the Python standard library's source), prints the report's
path and a summary table, and exports the final model as a directory plain
``transformers`` loads (``<report dir>/export``). ``--model gpt`` trains the
reference byte-level GPT instead. Links between regions are emulated in the
transport (one-way delay and bandwidth per region pair, from the demo
scenario); inside a region they are plain loopback. Every child is stopped on
exit or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

#: Three regions, 100 Mbit/s and 40-150 ms between them (the end-to-end benchmark's default shape).
DEMO_SCENARIO: dict[str, Any] = {
    "regions": {
        "us-east": {"egress_usd_per_gb": 0.02},
        "eu-west": {"egress_usd_per_gb": 0.02},
        "ap-south": {"egress_usd_per_gb": 0.08},
    },
    "links": [
        {"a": "us-east", "b": "us-east", "bandwidth_gbps": 10.0, "rtt_ms": 1},
        {"a": "eu-west", "b": "eu-west", "bandwidth_gbps": 10.0, "rtt_ms": 1},
        {"a": "ap-south", "b": "ap-south", "bandwidth_gbps": 10.0, "rtt_ms": 1},
        {"a": "us-east", "b": "eu-west", "bandwidth_gbps": 0.1, "rtt_ms": 76},
        {"a": "us-east", "b": "ap-south", "bandwidth_gbps": 0.1, "rtt_ms": 150},
        {"a": "eu-west", "b": "ap-south", "bandwidth_gbps": 0.1, "rtt_ms": 120},
    ],
}
REGIONS = ("us-east", "eu-west", "ap-south")
PRICES = {"us-east": 2.0, "eu-west": 2.2, "ap-south": 1.4}


#: The demo's Llama: four decoder layers of width 48 (about the reference "tiny" GPT's compute per token).
DEMO_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 48, "intermediate_size": 128,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "initializer_range": 0.02,
    "tie_word_embeddings": False, "vocab_size": 1024,
}


def demo_job(*, steps: int, peers: int, preset: str, model: str = "gpt", hf_config: str | None = None) -> dict[str, Any]:
    """The demo's job: the reference GPT ``preset`` on byte tokens, or (``model="llama"``) the Llama whose
    config is at ``hf_config`` with a BPE of 1024 tokens trained on the embedded corpus."""
    if model == "llama":
        assert hf_config is not None
        model_section: dict[str, Any] = {"hf_config": hf_config, "seq_len": 64}
        data: dict[str, Any] = {"source": "stdlib", "max_bytes": 2 << 20, "tokenizer": "bpe:1024"}
    else:
        model_section, data = {"preset": preset}, {"source": "stdlib", "max_bytes": 2 << 20}
    return {
        "job": {"name": "demo", "seed": 0},
        "model": model_section,
        "data": data,
        # every peer trains (the planner still places them and cuts the stages): with 6 peers sharing a few
        # cores, benchmarked compute flatters one pipeline and the planner sometimes picks it alone
        "pipeline": {"stages": 2, "pipelines": max(1, peers // 2), "micro_batch_size": 8, "microbatches": 2,
                     "schedule": "1f1b"},
        "optimizer": {"lr": 3e-3},
        "sync": {"every": 10, "codec": "int8", "fragments": 1, "overlap": 5},  # streaming: rounds hide behind steps
        "codecs": {"activation": "fp16", "activation_grad": "fp16"},
        "stop": {"steps": steps},
        "swarm": {"min_peers": peers, "wait_peers_s": 180.0, "hop_timeout_s": 30.0, "round_timeout_s": 30.0,
                  "heartbeat_s": 2.0},
        "report": {"dir": "runs", "eval_every": 20, "eval_batches": 8, "export": model == "llama"},
    }


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a 3-region job on this machine and report", description=__doc__)
    p.add_argument("--peers", type=int, default=6, help="peers to start (default 6, spread over 3 regions)")
    p.add_argument("--steps", type=int, default=120, help="inner steps to train (default 120)")
    p.add_argument("--model", choices=("llama", "gpt"), default="llama",
                   help="llama (default): a tiny transformers Llama with a BPE tokenizer; gpt: the byte-level GPT")
    p.add_argument("--preset", default="tiny", help="with --model gpt: the GPT preset (default tiny; small is slower)")
    p.add_argument("--report-dir", default=None, help="where the report goes (default runs/demo-<time>)")
    p.add_argument("--json", action="store_true", help="JSON lines instead of the live view")
    p.add_argument("--no-emulation", action="store_true", help="plain loopback between regions")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from geotrain.cli.run import print_summary, run_coordinator
    from geotrain.config import job_from_dict
    from geotrain.local.procs import ChildGroup
    from geotrain.local.swarm import start_local_swarm

    if args.peers < 2:
        print("geotrain demo: --peers must be >= 2", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    say = (lambda e: print(json.dumps(e, default=str), flush=True)) if args.json else (lambda e: None)
    job_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    report_dir = Path(args.report_dir) if args.report_dir else Path("runs") / job_id
    with tempfile.TemporaryDirectory(prefix="geotrain-demo-") as tmp, ChildGroup() as children:
        llama = Path(tmp) / "llama"
        llama.mkdir()
        (llama / "config.json").write_text(json.dumps(DEMO_LLAMA))  # the job record carries it to the peers
        job = job_from_dict(demo_job(steps=args.steps, peers=args.peers, preset=args.preset, model=args.model,
                                     hf_config=str(llama)))
        scenario = Path(tmp) / "scenario.json"
        scenario.write_text(json.dumps(DEMO_SCENARIO))
        if not args.json:
            print(f"geotrain demo: {args.peers} peers in {len(REGIONS)} emulated regions "
                  f"({'links emulated in the transport: delay + bandwidth' if not args.no_emulation else 'no emulation'})",
                  flush=True)
        local = start_local_swarm(
            children,
            regions=[REGIONS[i % len(REGIONS)] for i in range(args.peers)],
            job_id=job_id,
            prices=PRICES,
            emulate=None if args.no_emulation else str(scenario),
            emulate_bandwidth=True,
        )
        maddrs = local.maddrs
        for info in local.ready:
            say(info)
        if args.json:
            report = run_coordinator(None, initial_peers=maddrs, job_id=job_id, report_dir=report_dir,
                                     emit=say, stop=stop, job=job)
        else:
            from geotrain.coordinator.live import LiveView

            with LiveView() as view:
                report = run_coordinator(None, initial_peers=maddrs, job_id=job_id, report_dir=report_dir,
                                         emit=view, stop=stop, job=job)
    path = report_dir / "report.json"
    if args.json:
        say({"event": "done", "report": str(path), "summary": report["summary"]})
    else:
        print_summary(report)
        print(f"report: {path}  (plots: {', '.join(sorted(p.name for p in report_dir.glob('*.png')))})")
        if (report_dir / "export").is_dir():
            print(f"model: {report_dir / 'export'}  (transformers.AutoModelForCausalLM.from_pretrained loads it)")
    return 0
