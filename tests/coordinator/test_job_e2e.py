"""End to end: a bootstrap + 4 peers in 2 regions, a tiny job through `geotrain run`'s code path."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geotrain.cli.run import run_coordinator
from geotrain.config import job_from_dict
from geotrain.coordinator.evaluate import initial_row
from geotrain.coordinator.report import REPORT_KEYS
from geotrain.local.procs import Child, ChildGroup
from geotrain.local.swarm import LocalSwarm, start_local_swarm
from geotrain.plan import JobPlan

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


def tiny_job(*, steps: int, min_peers: int = 4) -> dict[str, Any]:
    return {
        "job": {"name": "e2e", "seed": 1},
        "model": {"preset": "tiny"},
        "data": {"max_bytes": 1 << 20},
        "pipeline": {"stages": 2, "pipelines": "auto", "micro_batch_size": 4, "microbatches": 2},
        "sync": {"every": 5, "codec": "int8"},
        "stop": {"steps": steps},
        "swarm": {"min_peers": min_peers, "wait_peers_s": 120, "hop_timeout_s": 20, "round_timeout_s": 20},
        "report": {"eval_batches": 4},
    }


@pytest.fixture(scope="module")
def swarm4() -> Iterator[LocalSwarm]:
    """One swarm (a bootstrap, 2 peers in ``us``, 2 in ``eu``) for this module's jobs that leave every peer alive.

    Its peers follow the newest job (no ``--job``): each test's job is a new job id, so the tests stay
    independent of each other; the ones that kill or add a peer start their own swarm. The tests that
    use it come last in the module, so it is reaped right after them.
    """
    group = ChildGroup(preload=True)
    try:
        yield start_local_swarm(group, regions=["us", "us", "eu", "eu"])
    finally:
        group.close(grace=2.0)  # as the `children` fixture (tests/conftest.py)


def test_killed_peer_is_replanned_and_job_finishes(children: ChildGroup, tmp_path: Path) -> None:
    # the stop step is out of reach: the test stops the coordinator once the replanned job has trained a while
    # (a fixed step count left the kill, the replan and the recovery racing the job's end)
    spec = tiny_job(steps=1_000_000)
    spec["report"]["eval_every"] = 100
    # the planner may run one pipeline with spares: then the victim held its blocks alone, and only this lets the
    # job go on (from the seed for those blocks) instead of stopping with an error naming them
    spec["checkpoint"] = {"allow_seed_restart": True}
    job = job_from_dict(spec)
    swarm = start_local_swarm(children, regions=["us", "us", "eu", "eu"], job_id="e2e-kill", heartbeat_s=1.0)
    events: list[dict[str, Any]] = []
    killed, replanned, done = threading.Event(), threading.Event(), threading.Event()
    victim: list[str] = []
    seed_loss = initial_row(job)["loss"]  # the report's first validation row, the seeded model's
    covered_at_kill: list[int] = []
    index = {r["peer_id"]: i for i, r in enumerate(swarm.ready)}

    def on_event(e: dict[str, Any]) -> None:
        events.append(e)
        if e.get("event") == "replan" and killed.is_set():
            replanned.set()
        elif e.get("event") == "validation" and e.get("loss") is not None:
            # the coordinator ends its watch and writes the report (with a final evaluation) once the job has
            # trained on past the replan: to 0.5 below the seed's loss, which blocks the victim held alone and
            # restarted from the seed must first win back (a loaded machine once had 200 steps fall short), or
            # at step 1,200, where the assertion below says how far it got
            if replanned.is_set() and e["step"] >= 200 and (e["loss"] < seed_loss - 0.5 or e["step"] >= 1200):
                done.set()
        elif e.get("event") == "progress" and not killed.is_set():
            # a peer the plan uses (training; spares never train), once the watch follows the job from the region
            # digests (its death must be seen through them), or a while in (then the test fails, saying so)
            training = [pid for pid, p in e["peers"].items() if p["status"] == "training" and p["step"] >= 6]
            covered = e["watch_reads"]["covered"]
            if training and (covered >= 2 or max(e["peers"][p]["step"] for p in training) >= 1500):
                victim.append(training[0])
                covered_at_kill.append(covered)
                killed.set()
                children.kill(swarm.peers[index[training[0]]], signal.SIGKILL)

    report = run_coordinator(None, initial_peers=swarm.maddrs, job_id="e2e-kill", report_dir=tmp_path,
                             emit=on_event, job=job, stop=done)
    assert killed.is_set()
    assert covered_at_kill[0] >= 2, f"the watch never read the job from the region digests: {report['control_plane']}"
    kinds = [e["kind"] for e in report["events"]]
    assert "death" in kinds and "replan" in kinds
    assert report["summary"]["plan_versions"] >= 2
    dead = victim[0]
    last_plan = report["plans"][-1]
    assert dead not in {s["peer"] for pipe in last_plan["pipelines"] for s in pipe}
    val = [v for v in report["validation"] if v["loss"] is not None]
    assert val[-1]["loss"] < val[0]["loss"] - 0.5, val  # progress survived the replan


AFTER_JOIN = 600  # steps trained after the join before the test stops the job


def test_joiner_mid_run_is_folded_in_and_pulls_verified_state(children: ChildGroup, tmp_path: Path) -> None:
    """Issue 9 item 5: a peer that arrives while the job trains (rounds in flight) joins at the next plan
    version, pulls committed global state from the others (size + hash verified), and the job finishes."""
    # the job cannot end before the join: its stop step is out of reach, and the test stops the coordinator
    # once the global model was evaluated AFTER_JOIN steps past the join (a fixed 1,500-step job raced the late
    # peer's start). Not at the first evaluation after it: the loss right after a join was once 0.1 above the
    # last one before it (the restart at a round boundary, likely), which a longer run leaves behind. The one
    # setback seen at the end (0.49) came in a run whose replan made both old pipeline peers spares, and they,
    # never told, trained on under the old plan for 29 s (news reaches them now: coordinator.news_contacts)
    spec = tiny_job(steps=1_000_000, min_peers=3)
    spec["report"]["eval_every"] = 200  # validation losses before and after the join
    swarm = start_local_swarm(children, regions=["us", "us", "eu"], job_id="e2e-join")
    joined: list[dict[str, Any]] = []
    started, folded_in, done = threading.Event(), threading.Event(), threading.Event()
    steps_seen = [0]  # the furthest step a progress event showed: at the join, where the job was
    join_step: list[int] = []
    stop_eval: list[dict[str, Any]] = []  # the evaluation that ended the watch

    def on_event(e: dict[str, Any]) -> None:
        # the late peer starts with the first plan: it is ready 15-30 s later, while the job trains
        if e.get("event") == "plan" and not started.is_set():
            started.set()
            late = children.start("late", ["peer", "--initial-peers", *swarm.maddrs, "--region", "eu",
                                           "--threads", "1", "--heartbeat", "1", "--job", "e2e-join"])
            joined.append({"child": late})
        elif e.get("event") == "progress" and e["peers"]:
            steps_seen[0] = max(steps_seen[0], *(p["step"] for p in e["peers"].values()))
        elif e.get("event") == "replan" and e.get("reason") == "join" and not folded_in.is_set():
            join_step.append(steps_seen[0])
            folded_in.set()
        elif e.get("event") == "validation" and folded_in.is_set() and e["step"] >= join_step[0] + AFTER_JOIN:
            stop_eval.append(e)
            done.set()  # the coordinator ends its watch and writes the report (with a final evaluation)

    report = run_coordinator(None, initial_peers=swarm.maddrs, job_id="e2e-join", report_dir=tmp_path,
                             emit=on_event, job=job_from_dict(spec), stop=done)
    assert started.is_set()
    late_id = joined[0]["child"].wait_event("ready", timeout=5)["peer_id"]
    reasons = [p["reason"] for p in report["plans"]]
    late_events = [line for line in list(joined[0]["child"].lines) if line.startswith("{")]
    assert "join" in reasons, (reasons, report["summary"].get("wall_s"), late_events[:12])
    # every adoption past the job's first plan took committed state (own, a donor's, a checkpoint): a stage
    # restarted from the seed mid-run would split its group and set the model back to step 0
    adopted = _plan_events([*swarm.peers, joined[0]["child"]])
    seeded = [e for e in adopted if e["state"] == "seed" and (e["plan_version"] > 1 or e["start_step"] > 0)]
    assert not seeded, adopted
    join_t = next(p["t_s"] for p in report["plans"] if p["reason"] == "join")
    last = report["plans"][-1]
    placed = {s["peer"] for pipe in last["pipelines"] for s in pipe} | set(last["spares"])
    assert late_id in placed
    assert report["plans"][-1]["start_step"] > 0  # restarted at a round boundary, not from scratch
    # numbered on from the furthest peer, never back: the steps before the join are not trained again
    join_plan = next(p for p in report["plans"] if p["reason"] == "join")
    every = spec["sync"]["every"]
    assert join_plan["start_step"] >= join_step[0] // every * every >= join_plan["state_step"], (join_plan, join_step)
    val = [v for v in report["validation"] if v["loss"] is not None]
    assert val[-1]["loss"] < val[0]["loss"] - 0.5, val
    # the join set nothing back: the watch's last evaluation, AFTER_JOIN steps past it, is no worse than the last
    # one before it, up to noise. 0.1: consecutive evaluations (4 batches, 100 to 200 steps apart) of a plan nobody
    # joined differ by up to 0.09 here, while a stage restarted from the seed costs more than 2 (the loss at step 0
    # is 5.4, 2.8 at step 800). Not the report's final row: the peers train on until the coordinator has fetched
    # the final model, 90 to 480 steps more on a loaded box, where this tiny model's loss has also gone up (2.73 to
    # 2.98 once, with no replan), which is no verdict on the join.
    before = [v for v in val if v["t_s"] < join_t]
    after = [v for v in val if v["t_s"] > join_t and v["step"] <= stop_eval[0]["step"]]
    assert before and after, (join_t, val)
    assert after[-1]["loss"] <= before[-1]["loss"] + 0.1, (join_t, val)


def _plan_events(peers: list[Child]) -> list[dict[str, Any]]:
    """Every ``plan`` event (one per adopted plan version, with its state source) the peers printed so far."""
    out = []
    for child in peers:
        for line in list(child.lines):
            if line.startswith("{") and '"event": "plan"' in line:
                out.append(json.loads(line))
    return out


@pytest.mark.parametrize("overlap", [0, 2])
def test_tiny_job_trains_and_reports(swarm4: LocalSwarm, tmp_path: Path, overlap: int) -> None:
    spec = tiny_job(steps=20)
    spec["sync"]["overlap"] = overlap  # streaming: the last round is still in flight at the stop step
    job = job_from_dict(spec)
    events: list[dict[str, Any]] = []
    # a job id of its own: the module's swarm follows the newest job, and each test's rounds start at 1
    job_id = f"e2e-basic-{overlap}-{tmp_path.name}"
    report = run_coordinator(None, initial_peers=swarm4.maddrs, job_id=job_id, report_dir=tmp_path,
                             emit=events.append, job=job)
    data = json.loads((tmp_path / "report.json").read_text())
    assert set(REPORT_KEYS) <= set(data)
    for png in ("loss_vs_tokens.png", "loss_vs_time.png", "throughput.png", "traffic.png", "cost.png"):
        assert (tmp_path / png).stat().st_size > 1000
    val = [v for v in data["validation"] if v["loss"] is not None]
    assert val[0]["source"] == "init" and val[-1]["source"] == "global"
    assert val[-1]["loss"] < val[0]["loss"] - 0.3, val
    assert val[-1]["round"] == 20 // 5, val  # the final global model holds every round, the last one too
    s = report["summary"]
    pipelines = len(data["plans"][-1]["pipelines"])  # the planner's choice (measured compute varies here)
    assert s["tokens"] == pipelines * 20 * 4 * 2 * 32  # pipelines x 20 steps x (4 x 2) sequences x 32 tokens
    assert s["plan_versions"] == 1 and s["deaths"] == 0
    assert data["bytes"]["total"] > 0 and data["usd"]["total"] > 0
    assert any(e["event"] == "plan" for e in events)
    pipes = data["plans"][-1]["pipelines"]
    plan = JobPlan.from_dict({"job_id": job_id, "version": 1, "pipelines": pipes, "num_blocks": pipes[0][-1]["layers"][1]})
    for pid in plan.peers:
        ps = data["peer_stats"][pid]  # where each plan peer's time went, from its last progress record
        # 4 rounds per stage group the peer is in: pipelines cut at different blocks put a peer in several
        # (one pipeline's [0:6) stage syncs [0:3) and [3:6) with another's two stages)
        assert ps["steps"] == 20 and ps["rounds"] == 20 // 5 * len(plan.groups_of(pid)), (ps, plan.sync_groups())
        assert 0 < ps["compute_s"] <= ps["wall_s"] and ps["round_s"] > 0 and ps["cpu_s"] > 0, ps
        assert 0 <= ps["sync_wait_s"] <= ps["wall_s"], ps


def test_stop_after_round_k_then_resume_continues_at_k_plus_1(swarm4: LocalSwarm, tmp_path: Path) -> None:
    from geotrain.coordinator.evaluate import validation_loss
    from geotrain.peers import checkpoint

    ckpt = tmp_path / "ckpt"
    spec = tiny_job(steps=10)  # every = 5: rounds 1 and 2, a checkpoint after each
    spec["checkpoint"] = {"dir": str(ckpt), "every_rounds": 1}
    swarm = swarm4
    first = run_coordinator(None, initial_peers=swarm.maddrs, job_id="e2e-ck1", report_dir=tmp_path / "r1",
                            job=job_from_dict(spec))
    num_blocks = 6
    assert checkpoint.latest_complete(ckpt, num_blocks) == 10
    saved = checkpoint.load(ckpt, 10, job_id="x")
    assert saved.round == 2
    assert first["summary"]["val_loss_final"] == pytest.approx(validation_loss(job_from_dict(spec), saved.params), abs=1e-6)

    # resume with a stop step equal to the checkpoint: the swarm's global model must equal the checkpoint
    spec["checkpoint"] = {"dir": None}
    same = run_coordinator(None, initial_peers=swarm.maddrs, job_id="e2e-ck2", report_dir=tmp_path / "r2",
                           job=job_from_dict(spec), resume=ckpt)
    assert same["plans"][0]["start_step"] == 10
    assert same["summary"]["val_loss_final"] == pytest.approx(first["summary"]["val_loss_final"], abs=1e-6)

    # resume and train one more round: the round counter goes on at 3
    spec["stop"] = {"steps": 15}
    more = run_coordinator(None, initial_peers=swarm.maddrs, job_id="e2e-ck3", report_dir=tmp_path / "r3",
                           job=job_from_dict(spec), resume=ckpt)
    assert more["plans"][0]["start_step"] == 10
    last = more["checkpoints"]["last_round"]
    if len(more["plans"]) == 1:
        assert last == 3 and checkpoint.load(ckpt, 15, job_id="x").round == 3
    else:
        # a replan (a peer missed on a busy machine) whose start step lagged a committed round: the groups go
        # on from their newest round (geotrain.peers.worker._catch_up) and train steps 10-15 again past it
        assert last >= 3, [(p["version"], p["reason"], p["start_step"]) for p in more["plans"]]
    assert checkpoint.latest_complete(ckpt, num_blocks) == 15
