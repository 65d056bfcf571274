"""Child processes for multi-process tests and the demo.

A child prints JSON lines on stdout; the first ``{"event": "ready", ...}`` line
is its handshake. :class:`ChildGroup` starts children, waits for that line
with a timeout (no sleeps, no log regexes) and reaps every child on exit.
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
    proc: subprocess.Popen[str]
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    lines: list[str] = field(default_factory=list)
    seen: list[dict[str, Any]] = field(default_factory=list)  # every event taken by next_event/wait_event

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def popen(self) -> subprocess.Popen[str]:
        return self.proc

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON event, or None after ``timeout``; RuntimeError if the child exited with none left."""
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            if self.proc.poll() is not None and self.events.empty():
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}; output: {self.lines[-20:]}"
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
        raise TimeoutError(f"{self.name}: no {event!r} event within {timeout}s; last output: {self.lines[-5:]}")

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
                pass


class ChildGroup:
    """Starts ``python -m geotrain ...`` children and guarantees they are reaped.

    Use as a context manager (or call :meth:`close`). Children run in their own
    process group, so killing one also kills the helper daemons it spawned.
    """

    def __init__(self, *, env: dict[str, str] | None = None, echo_stderr: bool = False) -> None:
        self.children: list[Child] = []
        # the child asks the kernel to stop it if this process dies without close() (see geotrain.cli)
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", "GEOTRAIN_PARENT_PID": str(os.getpid()), **(env or {})}
        self._echo_stderr = echo_stderr

    def start(
        self, name: str, args: Sequence[str], *, module: str = "geotrain", prefix: Sequence[str] = (),
        env: dict[str, str] | None = None, stdin: bool = False, stderr_path: str | None = None,
    ) -> Child:
        """Start ``[*prefix, python, -m, module, *args]``; ``prefix`` e.g. ``ip netns exec REGION``.

        ``stdin``: keep a pipe open for :meth:`Child.send`; ``stderr_path``: write stderr there.
        """
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
        child = Child(name=name, proc=proc)
        threading.Thread(target=self._pump, args=(child,), daemon=True, name=f"pump-{name}").start()
        self.children.append(child)
        return child

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
