"""Several local ranks behind one peer: a node with N devices is one member of the swarm.

``geotrain peer --nproc-per-node N`` (or ``--devices cuda:0,cuda:1``) starts N - 1 helper processes
beside itself (*rank 0*, the peer: its identity, DHT presence, data-plane endpoint and link probes
stay one). The ranks form a torch.distributed process group of their own (gloo on CPU, NCCL when every
rank has its own CUDA device), rendezvousing on a TCP store bound to 127.0.0.1 port 0. Each holds a
copy of the peer's stage and computes a share of every microbatch:

- **forward**: rank 0 splits the microbatch along the batch dimension into near-equal chunks (rank 0
  keeps the first), sends each helper its chunk (and, on the last stage, its targets), computes its own
  chunk and gathers the helpers' outputs (on the last stage: their chunk losses, weighted by their
  share of the tokens, so the sum is the whole microbatch's mean loss);
- **backward**: the gradient of the gathered output is split the same way; each rank back-propagates
  its chunk through the graph it kept, and rank 0 gathers the input gradients the previous stage needs;
- **after the microbatches**: the helpers' parameter gradients are summed into rank 0's (one reduce of
  one flat buffer, with a flag per parameter so a parameter nobody touched keeps no gradient, as on one
  rank); rank 0 then runs everything else as a one-rank peer does (tied gradients, its optimizer step,
  the stage-group rounds) and broadcasts the resulting parameters to the helpers.

So one inner step of an N-rank peer is the inner step of one rank on the same batch, up to the order of
float sums (``tests/peers/test_local_ranks.py``). Helpers hold no optimizer and no sync state; DiLoCo
sees one member per node.

Commands reach a helper as JSON lines on its stdin (no pickle anywhere); tensors go over the process
group. A helper whose parent dies reads end-of-file and exits. A helper that dies, or a collective that
does not complete within ``timeout_s``, raises :class:`~geotrain.errors.LocalRankError` in rank 0: the
peer then leaves the swarm (``peers/agent.py``) rather than hang in a collective.

Evaluation runs on rank 0 alone (forward only, rare). FSDP-style sharding of a stage over the ranks is
not built: every rank holds the whole stage.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from geotrain.errors import ConfigError, LocalRankError

__all__ = ["LocalRanks", "resolve_devices", "split_sizes"]

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
}


def _dtype_name(t: torch.Tensor) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ConfigError(f"local ranks cannot ship tensors of dtype {t.dtype}")
    return name


def split_sizes(rows: int, ranks: int) -> list[int]:
    """Rows of a microbatch per rank: near-equal, earlier ranks take the remainder; ranks past ``rows`` get 0."""
    base, extra = divmod(rows, ranks)
    return [base + (1 if r < extra else 0) for r in range(ranks)]


def resolve_devices(device: str, nproc: int | None = None, devices: str | None = None) -> tuple[str, ...]:
    """The local ranks' devices from ``--device``, ``--nproc-per-node`` and ``--devices``; () for one rank on
    ``--device``.

    ``--devices cuda:0,cuda:1`` names them; ``--nproc-per-node N`` makes N of ``--device`` (``cuda`` or
    ``auto`` on a GPU node: ``cuda:0`` .. ``cuda:N-1``; ``cpu``: N gloo ranks sharing the CPU).
    """
    if devices:
        names = tuple(d.strip() for d in devices.split(",") if d.strip())
        if nproc is not None and nproc != len(names):
            raise ConfigError(f"--nproc-per-node {nproc} but --devices names {len(names)}: {','.join(names)}")
        return names  # one name: a one-rank peer on that device
    if nproc is None or nproc == 1:
        return ()
    if nproc < 1:
        raise ConfigError(f"--nproc-per-node must be >= 1; got {nproc}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return ("cpu",) * nproc
    if device == "cuda":
        have = torch.cuda.device_count()
        if have < nproc:
            raise ConfigError(f"--nproc-per-node {nproc} needs {nproc} CUDA devices; this machine has {have}")
        return tuple(f"cuda:{i}" for i in range(nproc))
    raise ConfigError(
        f"--nproc-per-node {nproc} with --device {device}: use --device cuda (one rank per GPU), "
        "--device cpu, or name them with --devices cuda:0,cuda:1,..."
    )


def _flat_grads(params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """Every parameter's gradient (zeros where none) then one has-gradient flag per parameter, in fp32."""
    parts = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float() for p in params
    ]
    flags = torch.tensor([1.0 if p.grad is not None else 0.0 for p in params], device=params[0].device)
    return torch.cat([*parts, flags])


def _make_group(store: Any, rank: int, size: int, backend: str, timeout_s: float) -> Any:
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, opts)
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, size, opts)


class _Spread(torch.autograd.Function):
    """One microbatch forward (and, in backward, backward) over every local rank; see the module docstring."""

    @staticmethod
    def forward(
        ctx: Any, anchor: torch.Tensor, x: torch.Tensor, ranks: LocalRanks, mb: int, y: torch.Tensor | None
    ) -> torch.Tensor:
        # ``anchor``: an empty tensor that requires grad, so autograd calls backward even on the first stage,
        # whose input (token ids) has no gradient: the stage's parameters are not inputs of this function
        ctx.ranks, ctx.mb = ranks, mb
        ctx.x_grad = x.requires_grad
        out, held = ranks._forward(mb, x, y)
        ctx.held = held
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor | None, None, None, None]:
        x_grad = ctx.ranks._backward(ctx.mb, grad, ctx.held, want_input_grad=ctx.x_grad)
        ctx.held = None
        return None, x_grad, None, None, None


class LocalRanks:
    """Rank 0's side: the helpers, the process group, and the forward/backward/reduce/broadcast it drives.

    ``devices``: one torch device per rank, rank 0's first (``["cpu", "cpu"]`` for two gloo ranks on the
    CPU; ``["cuda:0", "cuda:1"]`` for NCCL). Start with :meth:`start`; :meth:`close` stops the helpers.
    Driven from one thread (the peer's step thread); :meth:`alive` may be asked from any.
    """

    def __init__(
        self, devices: Sequence[str], *, timeout_s: float = 60.0, threads: int | None = None
    ) -> None:
        if len(devices) < 2:
            raise ConfigError(f"local ranks need at least 2 devices; got {list(devices)}")
        self.devices = [str(d) for d in devices]
        cuda = [d for d in self.devices if d.startswith("cuda")]
        if cuda and (len(cuda) != len(self.devices) or len(set(cuda)) != len(cuda)):
            raise ConfigError(
                f"local ranks on CUDA need one distinct cuda:N device per rank; got {self.devices}"
            )
        self.backend = "nccl" if cuda else "gloo"
        self.size = len(self.devices)
        self.timeout_s = timeout_s
        self.threads = threads
        self._procs: list[subprocess.Popen[str]] = []
        self._group: Any = None
        self._store: Any = None
        self._stage: Any = None
        self._params: list[torch.nn.Parameter] = []
        self._anchor = torch.empty(0, requires_grad=True)
        self.compute_dtype = "fp32"
        self.bytes_moved = 0  # tensor bytes rank 0 sent to or received from its helpers

    # -- life ------------------------------------------------------------------------------------
    def start(self) -> LocalRanks:
        import torch.distributed as dist

        self._store = dist.TCPStore(
            "127.0.0.1",
            0,
            self.size,
            True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=self.timeout_s),
        )
        port = self._store.port
        for rank in range(1, self.size):
            cmd = [
                sys.executable,
                "-m",
                "geotrain.peers.ranks",
                "--rank",
                str(rank),
                "--size",
                str(self.size),
                "--port",
                str(port),
                "--device",
                self.devices[rank],
                "--backend",
                self.backend,
                "--timeout",
                str(self.timeout_s),
            ]
            if self.threads:
                cmd += ["--threads", str(self.threads)]
            self._procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, text=True))
        try:
            self._group = _make_group(self._store, 0, self.size, self.backend, self.timeout_s)
            self._barrier()
        except Exception as e:
            self.close()
            raise LocalRankError(f"local ranks did not start: {e}") from e
        logger.info("%d local ranks (%s) on %s", self.size, self.backend, ", ".join(self.devices))
        return self

    def alive(self) -> bool:
        return self._gone() is None

    def check(self) -> None:
        """Raise :class:`~geotrain.errors.LocalRankError` if a helper rank has exited."""
        gone = self._gone()
        if gone:
            raise LocalRankError(gone[0], rank=gone[1])

    def _gone(self, settle_s: float = 0.0) -> tuple[str, int] | None:
        """Which helpers exited (waiting up to ``settle_s`` for one to be seen: a collective fails on a
        killed rank's reset connection a moment before its exit can be reaped)."""
        deadline = time.monotonic() + settle_s
        while settle_s and all(p.poll() is None for p in self._procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        gone = {r: p.poll() for r, p in enumerate(self._procs, start=1) if p.poll() is not None}
        if not gone:
            return None
        return ", ".join(f"local rank {r} is gone (exit code {code})" for r, code in gone.items()), next(iter(gone))

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    assert p.stdin is not None
                    p.stdin.write(json.dumps({"op": "stop"}) + "\n")
                    p.stdin.flush()
                    p.stdin.close()
                except OSError:
                    pass
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs = []
        self._group = None
        self._store = None

    # -- commands --------------------------------------------------------------------------------
    def _tell(self, ranks: Sequence[int], command: dict[str, Any]) -> None:
        line = json.dumps(command) + "\n"
        for r in ranks:
            proc = self._procs[r - 1]
            try:
                assert proc.stdin is not None
                proc.stdin.write(line)
                proc.stdin.flush()
            except (OSError, ValueError) as e:
                raise LocalRankError(f"local rank {r} is gone (exit code {proc.wait()}): {e}", rank=r) from e

    def _everyone(self) -> list[int]:
        return list(range(1, self.size))

    def _wait(self, start: Callable[[], Any], what: str, rank: int | None = None) -> None:
        """Start a collective (``start`` returns its work) and wait for it. Both raise on a dead rank: gloo
        posts a send or receive at once and fails on a closed connection there, before any wait."""
        try:
            start().wait()
        except Exception as e:  # gloo/NCCL raise RuntimeError (a closed connection, a timeout)
            gone = self._gone(settle_s=2.0)
            if gone:
                raise LocalRankError(f"{gone[0]}: the {what} failed: {e}", rank=gone[1]) from e
            raise LocalRankError(f"the local {what} failed{f' with rank {rank}' if rank else ''} within "
                                 f"{self.timeout_s:.0f}s: {e}", rank=rank) from e

    def _send(self, t: torch.Tensor, rank: int) -> None:
        t = t.detach().contiguous()
        self.bytes_moved += t.numel() * t.element_size()
        self._wait(lambda: self._group.send([t], rank, 0), "send", rank)

    def _recv(
        self, shape: Sequence[int], dtype: torch.dtype, rank: int, device: torch.device
    ) -> torch.Tensor:
        t = torch.empty(tuple(shape), dtype=dtype, device=device)
        self._wait(lambda: self._group.recv([t], rank, 0), "receive", rank)
        self.bytes_moved += t.numel() * t.element_size()
        return t

    def _barrier(self) -> None:
        self._tell(self._everyone(), {"op": "barrier"})
        self._wait(self._group.barrier, "barrier")

    # -- the stage -------------------------------------------------------------------------------
    def build(
        self,
        model: Any,
        layers: tuple[int, int],
        seed: int,
        stage: torch.nn.Module,
        *,
        compute_dtype: str = "fp32",
    ) -> None:
        """Every helper builds blocks ``layers`` of ``model`` (a :class:`~geotrain.config.ModelSection`);
        ``stage`` is rank 0's copy, whose parameters :meth:`set_params` broadcasts."""
        spec = dataclasses.asdict(model)
        self._tell(
            self._everyone(),
            {
                "op": "build",
                "model": spec,
                "layers": list(layers),
                "seed": seed,
                "compute_dtype": compute_dtype,
            },
        )
        self._stage = stage
        self._params = list(stage.parameters())
        self.compute_dtype = compute_dtype
        self._barrier()  # every helper built its copy (or failed: it exits, and the barrier says so)

    def set_params(self) -> None:
        """Broadcast rank 0's parameters to the helpers (after a step, a round, a state load)."""
        assert self._stage is not None, "build() first"
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).float() for p in self._params])
        self._tell(self._everyone(), {"op": "params", "numel": flat.numel()})
        self.bytes_moved += flat.numel() * 4 * (self.size - 1)
        self._wait(lambda: self._group.broadcast(flat, 0), "broadcast of parameters")

    def reset(self) -> None:
        """A new step: helpers drop every graph they kept and their gradients."""
        self._tell(self._everyone(), {"op": "reset"})

    def reduce_grads(self) -> None:
        """Sum the helpers' parameter gradients into rank 0's (see the module docstring)."""
        assert self._stage is not None, "build() first"
        flat = _flat_grads(self._params)
        self._tell(self._everyone(), {"op": "grads", "numel": flat.numel()})
        self._wait(lambda: self._group.reduce(flat, 0), "reduce of gradients")
        self.bytes_moved += flat.numel() * 4 * (self.size - 1)
        n = len(self._params)
        flags = flat[-n:]
        pos = 0
        for p, flag in zip(self._params, flags.tolist(), strict=True):
            k = p.numel()
            if flag > 0:
                p.grad = flat[pos : pos + k].view_as(p).to(p.dtype)
            else:
                p.grad = None
            pos += k

    def forward(self, x: torch.Tensor, mb: int, y: torch.Tensor | None = None) -> torch.Tensor:
        """Microbatch ``mb`` through the stage on every rank: its output, or on the last stage (``y`` given)
        its mean token loss (a scalar); backward through it back-propagates on every rank."""
        return _Spread.apply(self._anchor, x, self, mb, y)

    def _forward(self, mb: int, x: torch.Tensor, y: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        stage = self._stage
        sizes = split_sizes(x.shape[0], self.size)
        chunks = list(x.split(sizes))
        ys: list[Any] = list(y.split(sizes)) if y is not None else [None] * self.size
        helpers = [r for r in range(1, self.size) if sizes[r] > 0]
        total_tokens = y.numel() if y is not None else 0
        for r in helpers:
            cmd: dict[str, Any] = {
                "op": "fwd",
                "mb": mb,
                "shape": list(chunks[r].shape),
                "dtype": _dtype_name(x),
                "grad": bool(x.requires_grad),
            }
            if y is not None:
                cmd.update(
                    y_shape=list(ys[r].shape), y_dtype=_dtype_name(y), weight=ys[r].numel() / total_tokens
                )
            self._tell([r], cmd)
        for r in helpers:
            self._send(chunks[r], r)
            if y is not None:
                self._send(ys[r], r)
        with torch.enable_grad():
            x0 = chunks[0].detach()
            if x.is_floating_point() and x.requires_grad:
                x0.requires_grad_(True)
            with self._autocast(x0.device):
                out0 = stage(x0)
                if y is not None:
                    out0 = stage.loss(out0, ys[0]) * (ys[0].numel() / total_tokens)
        if y is not None:
            total = out0.detach().float().reshape(1).clone()
            for r in helpers:
                total += self._recv((1,), torch.float32, r, total.device)
            return total.reshape(()).to(out0.dtype), (x0, out0, helpers, sizes)
        outs = [out0.detach()]
        for r in helpers:
            outs.append(self._recv((sizes[r], *out0.shape[1:]), out0.dtype, r, out0.device))
        return torch.cat(outs), (x0, out0, helpers, sizes)

    def _backward(
        self, mb: int, grad: torch.Tensor, held: Any, *, want_input_grad: bool
    ) -> torch.Tensor | None:
        x0, out0, helpers, sizes = held
        if out0.dim() == 0:  # the last stage: a scalar loss, the same upstream gradient for every rank
            grads = [grad.reshape(())] * self.size
        else:
            grads = list(grad.split(sizes))
        for r in helpers:
            self._tell(
                [r],
                {
                    "op": "bwd",
                    "mb": mb,
                    "dtype": _dtype_name(grad),
                    "input_grad": want_input_grad,
                    "scalar": out0.dim() == 0,
                },
            )
            self._send(grads[r].reshape(1) if out0.dim() == 0 else grads[r], r)
        with torch.enable_grad():
            out0.backward(grads[0].to(out0.dtype))
        if not want_input_grad:
            return None
        assert x0.grad is not None
        parts = [x0.grad]
        for r in helpers:
            parts.append(self._recv((sizes[r], *x0.shape[1:]), x0.grad.dtype, r, x0.device))
        return torch.cat(parts)

    def _autocast(self, device: torch.device) -> Any:
        return torch.autocast(
            device_type=device.type, dtype=torch.bfloat16, enabled=self.compute_dtype == "bf16"
        )


# -- a helper rank -----------------------------------------------------------------------------------
def _helper(rank: int, size: int, port: int, device: str, backend: str, timeout_s: float) -> int:
    import torch.distributed as dist

    from geotrain.config import ModelSection
    from geotrain.models import build_stage

    store = dist.TCPStore("127.0.0.1", port, size, False, timeout=datetime.timedelta(seconds=timeout_s))
    group = _make_group(store, rank, size, backend, timeout_s)
    dev = torch.device(device)
    stage: Any = None
    params: list[torch.nn.Parameter] = []
    compute_dtype = "fp32"
    held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def recv(shape: Sequence[int], dtype: str) -> torch.Tensor:
        t = torch.empty(tuple(shape), dtype=_DTYPES[dtype], device=dev)
        group.recv([t], 0, 0).wait()
        return t

    def autocast() -> Any:
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=compute_dtype == "bf16")

    for line in sys.stdin:  # end of file: the peer (rank 0) is gone
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "stop":
            break
        if op == "barrier":
            group.barrier().wait()
        elif op == "build":
            model = ModelSection(**cmd["model"])
            a, b = cmd["layers"]
            stage = build_stage(model.block_model(int(cmd["seed"])), (int(a), int(b)), int(cmd["seed"])).to(
                dev
            )
            params = list(stage.parameters())
            compute_dtype = cmd["compute_dtype"]
            held.clear()
        elif op == "params":
            flat = torch.empty(int(cmd["numel"]), dtype=torch.float32, device=dev)
            group.broadcast(flat, 0).wait()
            with torch.no_grad():
                pos = 0
                for p in params:
                    p.copy_(flat[pos : pos + p.numel()].view_as(p))
                    pos += p.numel()
        elif op == "reset":
            held.clear()
            for p in params:
                p.grad = None
        elif op == "fwd":
            x = recv(cmd["shape"], cmd["dtype"])
            if cmd["grad"]:
                x.requires_grad_(True)
            y = recv(cmd["y_shape"], cmd["y_dtype"]) if "y_shape" in cmd else None
            with autocast():
                out = stage(x)
                if y is not None:
                    out = stage.loss(out, y) * float(cmd["weight"])
            held[int(cmd["mb"])] = (x, out)
            send = out.detach().float().reshape(1) if y is not None else out.detach().contiguous()
            group.send([send], 0, 0).wait()
        elif op == "bwd":
            x, out = held.pop(int(cmd["mb"]))
            g = recv((1,) if cmd["scalar"] else out.shape, cmd["dtype"])
            out.backward(g.reshape(()).to(out.dtype) if cmd["scalar"] else g.to(out.dtype))
            if cmd["input_grad"]:
                assert x.grad is not None
                group.send([x.grad.contiguous()], 0, 0).wait()
        elif op == "grads":
            flat = _flat_grads(params)
            group.reduce(flat, 0).wait()
            for p in params:
                p.grad = None
        else:
            raise SystemExit(f"local rank {rank}: unknown command {op!r}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m geotrain.peers.ranks", description="a helper rank of a geotrain peer"
    )
    for name, kind in (
        ("--rank", int),
        ("--size", int),
        ("--port", int),
        ("--device", str),
        ("--backend", str),
        ("--timeout", float),
        ("--threads", int),
    ):
        p.add_argument(name, type=kind, required=name != "--threads")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        return _helper(a.rank, a.size, a.port, a.device, a.backend, a.timeout)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
