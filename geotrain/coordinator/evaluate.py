"""Validation loss of the *global* model: the coordinator assembles it from the stage groups.

The global model is what the swarm agrees on (each stage group's committed
global parameters); it is the model a checkpoint holds. The coordinator pulls
each block range from a member of its group over the data plane (verified by
size and hash, like a joiner's transfer), stitches the whole model together
and evaluates it on the job's fixed validation batches. The seeded initial
model is evaluated the same way, so the report shows what training bought.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from geotrain.config import JobSpec
from geotrain.errors import StateTransferError
from geotrain.models import build_stage
from geotrain.plan import JobPlan
from geotrain.sync.state import StageState, fetch_state
from geotrain.transport import Transport

logger = logging.getLogger(__name__)


@torch.no_grad()
def validation_loss(job: JobSpec, params: dict[str, torch.Tensor] | None = None) -> float:
    """Mean token loss of the whole model (seeded, or with ``params`` loaded) on the validation batches."""
    from geotrain.data.job import dataset_for

    seed = job.job.seed
    model = job.model.block_model(seed)
    full = build_stage(model, (0, model.num_blocks), seed)
    if params is not None:
        own = dict(full.named_parameters())
        missing = [n for n in own if n not in params]
        if missing:
            raise StateTransferError(f"assembled model lacks {len(missing)} parameters, e.g. {missing[:3]}")
        for n, p in own.items():
            p.copy_(params[n].to(p.dtype).view_as(p))
    full.eval()
    ds = dataset_for(job)
    batches = ds.val_batches(
        batch_size=job.pipeline.micro_batch_size, seq_len=job.model.context, num_batches=job.report.eval_batches
    )
    losses = [float(full.loss(full(b[:, :-1]), b[:, 1:])) for b in batches]
    return sum(losses) / len(losses)


def fetch_global(
    job: JobSpec, plan: JobPlan, transport: Transport, *, timeout: float = 60.0, attempts: int = 2
) -> StageState:
    """The whole global model, block range by block range, from the plan's stage groups.

    A block range whose every member failed to answer is asked again, up to ``attempts`` times in all (a
    refused CURVE handshake is redialled by the transport meanwhile): the final model is what the user came
    for, and one slow answer must not lose it.
    """
    everyone = {s.peer: s for pipe in plan.pipelines for s in pipe}
    state: StageState | None = None
    for group in plan.sync_groups():
        for m in group.members:
            sl = everyone[m]
            key = sl.curve_public_key.encode() if sl.curve_public_key else None
            transport.connect(m, sl.endpoint, region=sl.region, curve_server_key=key)
        for attempt in range(1, max(1, attempts) + 1):
            try:
                piece = fetch_state(
                    transport, group.members, job_id=plan.job_id, start=group.start, end=group.end,
                    timeout=timeout, plan_version=plan.version,
                )
                break
            except StateTransferError as e:
                if attempt >= attempts:
                    raise
                logger.info("blocks [%d, %d): %s; asking again", group.start, group.end, e)
        state = piece if state is None else state.merge(piece)
    if state is None:
        raise StateTransferError("the plan has no stage groups")
    return state


def initial_row(job: JobSpec) -> dict[str, Any]:
    """The report's first validation row: the seeded initial model's loss (computed here, nothing fetched)."""
    return {"t_s": 0.0, "step": 0, "round": 0, "tokens": 0, "loss": validation_loss(job), "source": "init"}


def final_row(
    job: JobSpec, plan: JobPlan, transport: Transport, *, t_s: float, tokens: int, keep: list[StageState] | None = None
) -> dict[str, Any]:
    """The final global model's validation row, its state fetched from the plan's stage groups.

    ``keep``: the final global state fetched is appended to it (the run directory's model is written from it).
    Raises what the fetch raises (:class:`~geotrain.errors.StateTransferError` and kin).
    """
    state = fetch_global(job, plan, transport, timeout=job.swarm.round_timeout_s)
    if keep is not None:
        keep.append(state)
    return {
        "t_s": t_s,
        "step": state.step,
        "round": state.round,
        "tokens": tokens,
        "loss": validation_loss(job, state.params),
        "source": "global",
    }

