"""The stage runtime: one stage of one pipeline, driven one inner step at a time.

What is an *inner step* here? One batch split into ``M`` microbatches; each
microbatch goes forward through every stage (activations over the forward
hops) and backward (activation gradients over the backward hops) in the order
the schedule gives (:mod:`geotrain.pipeline.schedule`); parameter gradients
accumulate across microbatches; weights tied across stages get their gradients
summed between the first and last stage; then each stage takes its own
optimizer step (AdamW by default). The loss is the mean over microbatches of
each microbatch's mean token loss, which equals the whole batch's mean loss.

Messages (kind, tag) — every one also carries job, plan version and step:

- ``pp.act`` ``(pipeline, step, mb)``: activations, stage s -> s + 1, the hop's activation codec;
- ``pp.grad`` ``(pipeline, step, mb)``: activation gradients, s -> s - 1, the hop's gradient codec;
- ``pp.tgt`` ``(pipeline, step)``: targets, first -> last stage (only with ``targets_from_first``);
- ``pp.tied`` ``(pipeline, step, group)``: gradient of a weight tied across stages, first <-> last, lossless;
- ``pp.eval`` / ``pp.evaltgt`` ``(pipeline, eval_id, i)``: forward-only validation activations / targets.

A message from another job, plan version or sender than expected is dropped
and counted as ``foreign``; leftovers of earlier steps are discarded at the
start of a step and counted as ``stale``. A neighbour that stays silent past
``hop_timeout_s`` fails the step with :class:`~geotrain.errors.StageFailedError`
naming that peer and the step. What happens to the step then: gradients of the
failed step are dropped (``zero_grad``) and weights are as after the last
completed step; retrying, rerouting or replanning is the caller's decision.
A hop whose send failed stays failed: build a new runtime (for the new plan
version) rather than reusing this one.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from geotrain.errors import ConfigError, PeerTimeoutError, PlanSupersededError, StageFailedError
from geotrain.models.stage import StageModule
from geotrain.pipeline.config import StageConfig
from geotrain.pipeline.hop import HopSender
from geotrain.pipeline.optim import inner_adamw
from geotrain.pipeline.schedule import make_schedule
from geotrain.transport import Message, Transport

__all__ = ["StageRuntime", "StepMetrics"]

logger = logging.getLogger(__name__)

#: how long a wait on a neighbour goes without a message before it checks for a newer plan (interrupt)
INTERRUPT_SLICE_S = 0.25

KINDS = ("pp.act", "pp.grad", "pp.tgt", "pp.tied")
EVAL_KINDS = ("pp.eval", "pp.evaltgt")


@dataclass
class StepMetrics:
    """What one inner step cost this stage.

    ``compute_s``: forward + backward time; ``optimizer_s``: the optimizer step;
    ``bubble_fraction`` = 1 - (compute_s + optimizer_s) / wall_s, the share of the
    step this stage sat idle (waiting on neighbours, fill and drain).
    """

    step: int
    stage: int
    loss: float | None  # mean token loss; last stage only
    tokens: int
    wall_s: float
    compute_s: float
    optimizer_s: float
    recv_wait_s: float
    send_busy_s: float  # sender threads' encode + hand-off time (overlaps compute)
    bubble_fraction: float
    bytes_sent: dict[str, int] = field(default_factory=dict)  # by destination peer
    bytes_recv: dict[str, int] = field(default_factory=dict)  # by sending peer
    dropped: dict[str, int] = field(default_factory=dict)  # "stale" / "foreign"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _ComputeClock:
    """Seconds a stage spends in its forward and backward calls.

    On the CPU, wall time around each call. On a GPU a call returns once its kernels are launched, so host
    time would count launches: there a CUDA event pair brackets each call on the current stream, and
    :meth:`seconds` waits for the last one and sums the pairs' elapsed times.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._total = 0.0
        self._t0 = 0.0
        self._open: Any = None
        self._pairs: list[tuple[Any, Any]] = []

    def start(self) -> None:
        if self.cuda:
            self._open = torch.cuda.Event(enable_timing=True)
            self._open.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pairs.append((self._open, end))
        else:
            self._total += time.perf_counter() - self._t0

    def seconds(self) -> float:
        if self._pairs:
            self._pairs[-1][1].synchronize()
            self._total += sum(a.elapsed_time(b) for a, b in self._pairs) / 1000.0
            self._pairs = []
        return self._total


class StageRuntime:
    """Runs one stage's part of each inner step (see the module docstring).

    ``prev_peer``/``next_peer``: neighbour peer ids (None at the ends);
    ``end_peer``: the peer of the other end stage, needed when weights are tied
    across stages or targets travel from the first stage. The caller has
    connected ``transport`` to all of them. ``data(step)`` returns the step's
    ``(B, T + 1)`` batch: required on the first stage, and on the last unless
    ``config.targets_from_first``.
    """

    def __init__(
        self,
        config: StageConfig,
        *,
        stage: StageModule,
        transport: Transport,
        prev_peer: str | None = None,
        next_peer: str | None = None,
        end_peer: str | None = None,
        data: Callable[[int], torch.Tensor] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        local: Any = None,
    ) -> None:
        c = config
        if stage.is_first != c.is_first or stage.is_last != c.is_last:
            raise ConfigError(
                f"stage module holds blocks {stage.layers} of {stage.num_blocks} but the config says stage "
                f"{c.stage} of {c.num_stages}; build the stage from the plan's layer range for this stage"
            )
        if (prev_peer is None) != c.is_first or (next_peer is None) != c.is_last:
            raise ConfigError("prev_peer is required except on the first stage, next_peer except on the last")
        needs_data = c.is_first or (c.is_last and not c.targets_from_first)
        if needs_data and data is None:
            raise ConfigError(f"stage {c.stage} needs data(step) -> (B, T + 1) batch (first stage, or last stage "
                              "without targets_from_first)")
        self.tied = sorted(stage.tied_parameters(), key=lambda t: t.group)
        talks_to_end = c.num_stages > 1 and (bool(self.tied) or (c.targets_from_first and (c.is_first or c.is_last)))
        if talks_to_end and end_peer is None:
            raise ConfigError("end_peer (the other end stage's peer) is required for tied weights or targets_from_first")
        self.config, self.stage, self.transport = c, stage, transport
        # where this stage computes: what arrives off the wire (always CPU) is moved there
        self.device = next((p.device for p in stage.parameters()), torch.device("cpu"))
        self.prev_peer, self.next_peer, self.end_peer, self.data = prev_peer, next_peer, end_peer, data
        # LocalRanks (geotrain.peers.ranks): this stage's copies on the peer's other local ranks, each computing
        # a share of every microbatch; their gradients are summed into this copy's before the optimizer step
        self.local = local
        self.optimizer = optimizer or inner_adamw(
            stage.parameters(), lr=c.lr, betas=c.betas, weight_decay=c.weight_decay
        )
        self.ops = make_schedule(
            c.schedule, stage=c.stage, num_stages=c.num_stages, microbatches=c.microbatches,
            max_in_flight=c.max_in_flight,
        )
        q, t = c.send_queue, c.hop_timeout_s
        self._hops: dict[str, HopSender] = {}
        if next_peer is not None:
            self._hops[next_peer] = HopSender(transport, next_peer, codec=c.act_codec, timeout_s=t, queue_size=q)
        if prev_peer is not None:
            self._hops[prev_peer] = HopSender(transport, prev_peer, codec=c.grad_codec, timeout_s=t, queue_size=q)
        if talks_to_end and end_peer is not None and end_peer not in self._hops:
            self._hops[end_peer] = HopSender(transport, end_peer, codec="none", timeout_s=t, queue_size=q)
        self._dropped: collections.Counter[str] = collections.Counter()
        self._recv_bytes: collections.Counter[str] = collections.Counter()
        self._recv_wait = 0.0
        # set from any thread by interrupt(): a wait on a neighbour that has gone INTERRUPT_SLICE_S without a
        # message gives up at once (a newer plan exists), instead of after the whole hop timeout
        self._superseded = threading.Event()
        self._superseded_by = ""

    # -- the public step API ----------------------------------------------------------------------
    def run_inner_step(self, step: int) -> StepMetrics:
        """Forward/backward over all microbatches, sum tied gradients, optimizer step; raises StageFailedError."""
        t0 = time.perf_counter()
        loss, compute_s, tokens = self.forward_backward(step)
        if self.local is not None:
            self.local.reduce_grads()
        self.sync_tied_grads(step)
        t1 = time.perf_counter()
        schedule = self.config.lr_schedule
        if schedule is not None:
            rate = schedule.at(step)
            for group in self.optimizer.param_groups:
                group["lr"] = rate
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        optimizer_s = time.perf_counter() - t1
        return self._metrics(step, loss, tokens, compute_s, optimizer_s, time.perf_counter() - t0)

    def forward_backward(self, step: int) -> tuple[float | None, float, int]:
        """Run the schedule for ``step``; gradients are left in ``.grad``. Returns (loss, compute seconds, tokens)."""
        c = self.config
        self._begin(step)
        self.optimizer.zero_grad(set_to_none=True)
        if self.local is not None:
            # the helpers drop what a failed step left them and take this copy's weights, as the last optimizer
            # step, a round or a state load left them
            self.local.reset()
            self.local.set_params()
        try:
            return self._run_schedule(step)
        except BaseException:
            self.optimizer.zero_grad(set_to_none=True)  # a failed step leaves no half-accumulated gradient
            raise
        finally:
            logger.debug("stage %d pipeline %d step %d done", c.stage, c.pipeline, step)

    def sync_tied_grads(self, step: int) -> None:
        """Sum the gradients of weights tied across stages with the other end's copies (both ends equal after)."""
        if not self.tied or self.config.num_stages == 1:
            return
        assert self.end_peer is not None
        for t in self.tied:
            grad = t.param.grad if t.param.grad is not None else torch.zeros_like(t.param)
            self._send(self.end_peer, "pp.tied", (t.group,), step, {"g": grad.detach()}, codec="none")
        for t in self.tied:
            theirs = self._recv("pp.tied", self.end_peer, step, (t.group,), "tied gradient")["g"]
            if theirs.shape != t.param.shape:
                raise StageFailedError(
                    f"tied gradient {t.group} from {self.end_peer} has shape {tuple(theirs.shape)}, "
                    f"expected {tuple(t.param.shape)}", peer=self.end_peer, step=step,
                )
            mine = t.param.grad if t.param.grad is not None else torch.zeros_like(t.param)
            t.param.grad = mine + theirs.to(mine.dtype)  # a + b == b + a exactly: both ends stay bitwise equal
        self._flush(step)

    @torch.no_grad()
    def run_eval(self, eval_id: int, batches: Callable[[int], torch.Tensor] | None, num_batches: int) -> float | None:
        """Forward-only mean loss over ``num_batches`` validation batches; the last stage returns it.

        ``batches(i)`` gives validation batch ``i`` as ``(B, T + 1)``: needed on the first stage, and on
        the last unless ``targets_from_first``. ``eval_id`` (e.g. the inner step) keys the messages;
        use a fresh one per evaluation. Activations use the hop's activation codec.
        """
        c = self.config
        if (c.is_first or (c.is_last and not c.targets_from_first)) and batches is None:
            raise ConfigError(f"stage {c.stage} needs validation batches for run_eval")
        p = c.pipeline
        for kind in EVAL_KINDS:
            self._dropped["stale"] += self.transport.discard(
                kind, lambda tag: len(tag) >= 2 and tag[0] == p and tag[1] < eval_id
            )
        total = 0.0
        for i in range(num_batches):
            batch = batches(i) if batches is not None and (c.is_first or c.is_last) else None
            if c.is_first:
                assert batch is not None
                x: torch.Tensor = batch[:, :-1]
                if c.targets_from_first and c.num_stages > 1:
                    assert self.end_peer is not None
                    self._send(self.end_peer, "pp.evaltgt", (i,), eval_id, {"y": batch[:, 1:].contiguous()},
                               codec="none")
            else:
                assert self.prev_peer is not None
                x = self._recv("pp.eval", self.prev_peer, eval_id, (i,), "validation activations")["x"]
            with self._autocast():
                out = self.stage(x)
            if c.is_last:
                if c.targets_from_first and not c.is_first:
                    assert self.end_peer is not None
                    y = self._recv("pp.evaltgt", self.end_peer, eval_id, (i,), "validation targets")["y"].long()
                else:
                    assert batch is not None
                    y = batch[:, 1:]
                total += float(self.stage.loss(out, y))
            else:
                assert self.next_peer is not None
                self._send(self.next_peer, "pp.eval", (i,), eval_id, {"x": out})
        self._flush(eval_id)
        return total / num_batches if c.is_last else None

    def interrupt(self, reason: str) -> None:
        """(Any thread.) Make a wait on a neighbour give up with PlanSupersededError once it has gone
        ``INTERRUPT_SLICE_S`` without a message: ``reason`` (a newer plan) says why. A pipeline whose
        messages keep flowing finishes its step."""
        self._superseded_by = reason
        self._superseded.set()

    def close(self) -> None:
        for hop in self._hops.values():
            hop.close()

    # -- internals --------------------------------------------------------------------------------
    def _autocast(self) -> Any:
        """bf16 autocast on this stage's device when the job computes in bf16 (a no-op context otherwise)."""
        enabled = self.config.compute_dtype == "bf16"
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _begin(self, step: int) -> None:
        p = self.config.pipeline
        for kind in KINDS:
            n = self.transport.discard(kind, lambda tag: len(tag) >= 2 and tag[0] == p and tag[1] < step)
            self._dropped["stale"] += n

    def _run_schedule(self, step: int) -> tuple[float | None, float, int]:
        c, m = self.config, self.config.microbatches
        inputs: list[torch.Tensor] = []
        targets: list[torch.Tensor] = []
        tokens = 0
        batch = None
        if c.is_first:
            assert self.data is not None
            batch = self.data(step)  # (B, T + 1)
            if batch.dim() != 2 or batch.shape[0] % m:
                raise ConfigError(f"batch of shape {tuple(batch.shape)}: its size must be a multiple of "
                                  f"pipeline.microbatches ({m})")
            tokens = batch.shape[0] * (batch.shape[1] - 1)
            inputs = list(batch[:, :-1].chunk(m))
            if c.targets_from_first and c.num_stages > 1:
                assert self.end_peer is not None
                self._send(self.end_peer, "pp.tgt", (), step, {"y": batch[:, 1:].contiguous()}, codec="none")
        if c.is_last:
            if c.targets_from_first and not c.is_first:
                assert self.end_peer is not None
                y = self._recv("pp.tgt", self.end_peer, step, (), "targets")["y"].long()
            else:  # a stage that is first and last read the batch above
                assert self.data is not None
                y = (batch if batch is not None else self.data(step))[:, 1:]
            if y.shape[0] % m:
                raise ConfigError(f"targets of shape {tuple(y.shape)}: size must be a multiple of microbatches ({m})")
            tokens = y.numel()
            targets = list(y.chunk(m))
        held_in: dict[int, torch.Tensor] = {}
        held_out: dict[int, torch.Tensor] = {}
        losses: list[torch.Tensor] = []  # read once at the end: a float() per microbatch would sync a GPU
        clock = _ComputeClock(self.device)
        for op, i in self.ops:
            if op == "F":
                x = inputs[i] if c.is_first else self._recv_act(step, i)
                clock.start()
                with self._autocast():
                    if self.local is not None:  # spread over the local ranks: the output, or the loss
                        res = self.local.forward(x, i, targets[i] if c.is_last else None)
                        out, loss = (res, res) if c.is_last else (res, None)
                    else:
                        out = self.stage(x)
                        loss = self.stage.loss(out, targets[i]) if c.is_last else None
                if loss is not None:
                    losses.append(loss.detach().float())
                    held_out[i] = loss / m
                else:
                    held_out[i] = out
                clock.stop()
                if not c.is_first:
                    held_in[i] = x
                if not c.is_last:
                    assert self.next_peer is not None
                    self._send(self.next_peer, "pp.act", (i,), step, {"x": out.detach()})
            else:
                out = held_out.pop(i)
                grad = None if c.is_last else self._recv_grad(step, i, out)
                clock.start()
                out.backward(grad)
                clock.stop()
                if not c.is_first:
                    x = held_in.pop(i)
                    assert self.prev_peer is not None and x.grad is not None
                    self._send(self.prev_peer, "pp.grad", (i,), step, {"g": x.grad})
        self._flush(step)
        loss_sum = float(torch.stack(losses).double().sum()) if losses else 0.0
        return (loss_sum / m if c.is_last else None), clock.seconds(), tokens

    def _recv_act(self, step: int, mb: int) -> torch.Tensor:
        assert self.prev_peer is not None
        x = self._recv("pp.act", self.prev_peer, step, (mb,), "activations")["x"]
        return x.requires_grad_(True) if x.is_floating_point() else x

    def _recv_grad(self, step: int, mb: int, out: torch.Tensor) -> torch.Tensor:
        assert self.next_peer is not None
        g = self._recv("pp.grad", self.next_peer, step, (mb,), "activation gradients")["g"]
        if g.shape != out.shape:
            raise StageFailedError(
                f"gradient for microbatch {mb} from {self.next_peer} has shape {tuple(g.shape)}; "
                f"expected {tuple(out.shape)}", peer=self.next_peer, step=step,
            )
        return g.to(out.dtype)

    def _send(
        self, peer: str, kind: str, tag: tuple[Any, ...], step: int, tensors: dict[str, torch.Tensor],
        codec: str | None = None,
    ) -> None:
        c = self.config
        msg = Message(kind=kind, tag=(c.pipeline, step, *tag), job=c.job, plan_version=c.plan_version, step=step,
                      tensors=tensors)
        self._hops[peer].submit(msg, codec)

    def _recv(self, kind: str, peer: str, step: int, tag: tuple[Any, ...], what: str) -> dict[str, torch.Tensor]:
        c = self.config
        full = (c.pipeline, step, *tag)
        deadline = time.monotonic() + c.hop_timeout_s
        t0 = time.perf_counter()
        try:
            while True:
                for hop in self._hops.values():
                    hop.check(step)
                left = deadline - time.monotonic()
                try:
                    msg = self.transport.recv(kind, full, timeout=max(0.0, min(INTERRUPT_SLICE_S, left)))
                except PeerTimeoutError as e:
                    if self._superseded.is_set():
                        raise PlanSupersededError(
                            f"stage {c.stage} of pipeline {c.pipeline}: gave up waiting for {what} from peer "
                            f"{peer} for step {step} {tag}: {self._superseded_by}", peer=peer, step=step,
                        ) from e
                    if left > INTERRUPT_SLICE_S:
                        continue
                    raise StageFailedError(
                        f"stage {c.stage} of pipeline {c.pipeline}: no {what} from peer {peer} for step {step} "
                        f"{tag} within {c.hop_timeout_s}s", peer=peer, step=step,
                    ) from e
                if msg.job != c.job or msg.plan_version != c.plan_version or msg.sender != peer:
                    self._dropped["foreign"] += 1
                    logger.debug("dropped %s from %r (job %r plan %d)", kind, msg.sender, msg.job, msg.plan_version)
                    continue
                self._recv_bytes[peer] += msg.nbytes
                if self.device.type == "cpu":
                    return msg.tensors
                return {k: v.to(self.device, non_blocking=True) for k, v in msg.tensors.items()}
        finally:
            self._recv_wait += time.perf_counter() - t0

    def _flush(self, step: int) -> None:
        for hop in self._hops.values():
            hop.flush(step)

    def _metrics(
        self, step: int, loss: float | None, tokens: int, compute_s: float, optimizer_s: float, wall_s: float
    ) -> StepMetrics:
        sent: dict[str, int] = {}
        busy = 0.0
        for peer, hop in self._hops.items():
            counters = hop.take_counters()
            sent[peer] = counters.bytes
            busy += counters.busy_s
        recv, self._recv_bytes = dict(self._recv_bytes), collections.Counter()
        dropped, self._dropped = dict(self._dropped), collections.Counter()
        wait, self._recv_wait = self._recv_wait, 0.0
        return StepMetrics(
            step=step, stage=self.config.stage, loss=loss, tokens=tokens, wall_s=wall_s, compute_s=compute_s,
            optimizer_s=optimizer_s, recv_wait_s=wait, send_busy_s=busy,
            bubble_fraction=max(0.0, 1.0 - (compute_s + optimizer_s) / wall_s) if wall_s else 0.0,
            bytes_sent=sent, bytes_recv=recv, dropped=dropped,
        )
