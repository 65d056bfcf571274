"""Child processes for multi-process tests and the demo.

A child prints JSON lines on stdout; the first ``{"event": "ready", ...}`` line
is its handshake. :class:`ChildGroup` starts children, waits for that line
with a timeout (no sleeps, no log regexes) and reaps every child on exit.

``ChildGroup(preload=True)`` forks each child (``python -m geotrain`` or another module) from
a server process that imported torch, hivemind and geotrain once (the stdlib's forkserver),
instead of a fresh interpreter that imports them again: about 2.7 CPU-seconds less per child,
the same command line, its own process group, pipes and environment. The multi-process tests
and the benchmarks that start many children use it.
A child started behind ``ip netns exec NAME`` is forked too: it enters the namespace itself
(``setns``) before it starts a thread or opens a socket.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Self

logger = logging.getLogger(__name__)


@dataclass
class Child:
    """One child process and the JSON events it printed so far."""

    name: str
    proc: subprocess.Popen[str] | ForkedProc
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    lines: list[str] = field(default_factory=list)
    seen: list[dict[str, Any]] = field(default_factory=list)  # every event taken by next_event/wait_event
    stderr_path: str | None = None  # where its stderr goes, if to a file: its tail explains a failure

    def stderr_tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines the child wrote to its stderr file ('' without one)."""
        if self.stderr_path is None:
            return ""
        try:
            with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def _explain(self) -> str:
        tail = self.stderr_tail()
        return f"\n--- the end of its stderr ({self.stderr_path}) ---\n{tail}" if tail else ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def popen(self) -> subprocess.Popen[str] | ForkedProc:
        return self.proc

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON event, or None after ``timeout``; RuntimeError if the child exited with none left."""
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            if self.proc.poll() is not None and self.events.empty():
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}; output: {self.lines[-20:]}{self._explain()}"
                ) from None
            return None
        self.seen.append(item)
        return item

    def wait_event(self, event: str, timeout: float) -> dict[str, Any]:
        """Block until the child prints ``{"event": event, ...}``; raise TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            item = self.next_event(min(left, 0.5))
            if item is not None and item.get("event") == event:
                return item
        raise TimeoutError(
            f"{self.name}: no {event!r} event within {timeout}s; last output: {self.lines[-5:]}{self._explain()}")

    def send(self, line: str) -> None:
        """Write one line to the child's stdin (started with ``stdin=True``)."""
        assert self.proc.stdin is not None, "start the child with stdin=True"
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            # children run in their own process group so p2pd and friends get the signal too
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                # no such group yet: a forked child that has not reached its setsid() (or one that just exited)
                try:
                    os.kill(self.proc.pid, sig)
                except ProcessLookupError:
                    pass


#: what the fork server imports once, before it forks any child (an import that fails is skipped)
PRELOAD = (
    "torch", "hivemind", "geotrain.cli", "geotrain.cli.peer", "geotrain.peers.agent", "geotrain.coordinator",
    "geotrain.swarm", "geotrain.transport", "geotrain.models", "geotrain.data",
)


class _Fd:
    """A file descriptor handed to a forked child: pickled as the fork server's copy of it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return (_Fd._rebuild, (reduction.DupFd(self.fd),))

    @staticmethod
    def _rebuild(dup: Any) -> _Fd:
        return _Fd(dup.detach())


def netns_of(prefix: Sequence[str]) -> str | None:
    """The namespace a ``prefix`` of exactly ``ip netns exec NAME`` runs its command in; else None."""
    parts = list(prefix)
    if len(parts) == 4 and os.path.basename(parts[0]) == "ip" and parts[1:3] == ["netns", "exec"]:
        return parts[3]
    return None


def enter_netns(name: str) -> None:
    """Move this (single-threaded) process into network namespace ``name``, as ``ip netns exec`` does.

    Threads and processes it starts afterwards inherit the namespace; sockets already open stay where
    they were made. Needs CAP_SYS_ADMIN, like ``ip netns exec``.
    """
    clone_newnet = 0x40000000
    fd = os.open(os.path.join("/run/netns", name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns = getattr(os, "setns", None)  # Python 3.12+
        if setns is not None:
            setns(fd, clone_newnet)
            return
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, clone_newnet) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name!r}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _forked_main(
    module: str, args: list[str], env: dict[str, str], stdin: _Fd, stdout: _Fd, stderr: _Fd, netns: str | None = None
) -> None:
    """The forked child: what ``[ip netns exec NETNS] python -m MODULE ARGS`` does, on the server's imports."""
    if netns is not None:
        enter_netns(netns)
    os.setsid()  # its own process group, like ``start_new_session`` (ChildGroup kills the group)
    for target, source in ((0, stdin.fd), (1, stdout.fd), (2, stderr.fd)):
        os.dup2(source, target)
        os.close(source)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (the process's own stdio)
    sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    # the server's sys.path was read at its start: a PYTHONPATH given to this child is honoured here
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    os.environ["GEOTRAIN_PARENT_PID"] = str(os.getppid())  # the server: it exits when the group's process does
    _own_hivemind_locks()
    # the fork server made its own start method this process's default; a fresh interpreter has the
    # platform's, and code that starts a process by default (hivemind's averager) relies on it
    import multiprocessing

    multiprocessing.set_start_method(None, force=True)
    if module == "geotrain":
        sys.argv = ["geotrain", *args]
        from geotrain.cli import main

        sys.exit(main(args))
    import runpy

    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    sys.exit(0)


def _own_hivemind_locks() -> None:
    """Give this process hivemind's process-shared locks of its own, as a fresh interpreter has.

    hivemind creates them at import (MPFuture's update and initialisation locks, SharedBytes', the async
    context executor's), so every child forked from the server would share the server's: a child killed
    while holding one (a SIGKILL mid-update) would leave the next child's DHT process blocked on it forever.
    """
    if "hivemind" not in sys.modules:
        return
    import multiprocessing

    from hivemind.utils import asyncio as hm_asyncio
    from hivemind.utils.mpfuture import MPFuture

    MPFuture.reset_backend()  # new update, initialisation and SharedBytes locks; no future exists yet
    wrapper = getattr(hm_asyncio, "_AsyncContextWrapper", None)  # private: absent in another hivemind, nothing to do
    if wrapper is not None:
        wrapper.EXECUTOR_LOCK = multiprocessing.Lock()


class ForkedProc:
    """The part of :class:`subprocess.Popen` a :class:`Child` uses, for a child forked from the server."""

    def __init__(self, process: Any, args: list[str], stdin: Any, stdout: Any) -> None:
        self._process = process
        self.args = args
        self.pid: int = process.pid
        self.stdin = stdin
        self.stdout = stdout

    @property
    def returncode(self) -> int | None:
        code = self._process.exitcode
        return None if code is None else int(code)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self.returncode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code


class ChildGroup:
    """Starts ``python -m geotrain ...`` children and guarantees they are reaped.

    Use as a context manager (or call :meth:`close`). Children run in their own
    process group, so killing one also kills the helper daemons it spawned.
    ``preload``: fork children from a server that imported :data:`PRELOAD` once, whatever
    ``module`` they run (one behind ``ip netns exec NAME`` too; any other ``prefix`` starts a
    fresh interpreter).
    """

    def __init__(self, *, env: dict[str, str] | None = None, echo_stderr: bool = False, preload: bool = False) -> None:
        self.children: list[Child] = []
        # the child asks the kernel to stop it if this process dies without close() (see geotrain.cli)
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", "GEOTRAIN_PARENT_PID": str(os.getpid()), **(env or {})}
        self._echo_stderr = echo_stderr
        self._preload = preload

    def start(
        self, name: str, args: Sequence[str], *, module: str = "geotrain", prefix: Sequence[str] = (),
        env: dict[str, str] | None = None, stdin: bool = False, stderr_path: str | None = None,
    ) -> Child:
        """Start ``[*prefix, python, -m, module, *args]``; ``prefix`` e.g. ``ip netns exec REGION``.

        ``stdin``: keep a pipe open for :meth:`Child.send`; ``stderr_path``: write stderr there.
        """
        netns = netns_of(prefix)
        if self._preload and (not prefix or netns is not None):
            return self._fork(name, module, list(args), env=env, stdin=stdin, stderr_path=stderr_path, netns=netns)
        cmd = [*prefix, sys.executable, "-m", module, *args]
        err: Any = None if self._echo_stderr else subprocess.DEVNULL
        if stderr_path is not None:
            err = open(stderr_path, "w")  # noqa: SIM115 (the child holds its own copy; ours closes below)
        try:
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                text=True,
                env={**self._env, **(env or {})},
                start_new_session=True,
            )
        finally:
            if stderr_path is not None:
                err.close()
        return self._track(Child(name=name, proc=proc, stderr_path=stderr_path))

    def _track(self, child: Child) -> Child:
        threading.Thread(target=self._pump, args=(child,), daemon=True, name=f"pump-{child.name}").start()
        self.children.append(child)
        return child

    def _fork(
        self, name: str, module: str, args: list[str], *, env: dict[str, str] | None, stdin: bool, stderr_path: str | None,
        netns: str | None = None,
    ) -> Child:
        import multiprocessing

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))  # read when the server starts: the first fork in this process
        out_r, out_w = os.pipe()
        in_r, in_w = os.pipe() if stdin else (os.open(os.devnull, os.O_RDONLY), -1)
        if stderr_path is not None:
            err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        elif self._echo_stderr:
            err = os.dup(2)
        else:
            err = os.open(os.devnull, os.O_WRONLY)
        try:
            process = ctx.Process(
                target=_forked_main, name=f"geotrain-{name}",
                args=(module, args, {**self._env, **(env or {})}, _Fd(in_r), _Fd(out_w), _Fd(err), netns),
            )
            process.start()
        except BaseException:
            for fd in (out_r, in_w):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in (out_w, in_r, err):
                os.close(fd)
        proc = ForkedProc(
            process, [module, *args],
            stdin=open(in_w, "w", encoding="utf-8") if in_w >= 0 else None,  # noqa: SIM115 (closed with the child)
            stdout=open(out_r, encoding="utf-8"),  # noqa: SIM115
        )
        return self._track(Child(name=name, proc=proc, stderr_path=stderr_path))

    @staticmethod
    def _pump(child: Child) -> None:
        assert child.proc.stdout is not None
        for line in child.proc.stdout:
            line = line.strip()
            if not line:
                continue
            child.lines.append(line)
            if line.startswith("{"):
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(item, dict):
                    child.events.put(item)

    def kill(self, child: Child, sig: int = signal.SIGKILL) -> None:
        child.signal(sig)
        try:
            child.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.signal(signal.SIGKILL)
            child.proc.wait(timeout=10)

    def dump_stacks(self, settle_s: float = 1.0) -> None:
        """Ask every live ``geotrain`` child to print each thread's stack to its stderr (SIGUSR1, to the child
        alone: its p2pd would die of it), then give them ``settle_s`` to write: a hung child says where."""
        for child in self.children:
            if child.proc.poll() is None:
                try:
                    os.kill(child.proc.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        time.sleep(settle_s)

    def close(self, grace: float = 5.0) -> None:
        for child in self.children:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.signal(signal.SIGKILL)
                child.proc.wait(timeout=10)
            # the group may still hold grandchildren (p2pd) after the leader exited
            try:
                os.killpg(child.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.children.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
