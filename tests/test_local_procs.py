"""geotrain.local.procs: a child forked from the preloaded server behaves like a fresh ``python -m geotrain``."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from geotrain.local.procs import ChildGroup, ForkedProc

pytestmark = pytest.mark.multiprocess


def test_a_forked_child_has_its_session_environment_stderr_and_exit_status(tmp_path: Path) -> None:
    log = tmp_path / "dht.err"
    with ChildGroup(preload=True, env={"GEOTRAIN_LOG_LEVEL": "DEBUG"}) as forked, ChildGroup() as fresh:
        child = forked.start("dht", ["dht"], stderr_path=str(log))
        plain = fresh.start("dht-plain", ["dht"])
        ready = child.wait_event("ready", 60)
        assert isinstance(child.proc, ForkedProc)
        assert ready.keys() == plain.wait_event("ready", 60).keys()  # the same handshake as a fresh interpreter
        assert os.getsid(child.pid) == child.pid  # its own session: ChildGroup kills the group
        with pytest.raises(subprocess.TimeoutExpired):
            child.proc.wait(timeout=0.1)
        assert child.proc.poll() is None

        os.kill(child.pid, signal.SIGKILL)
        assert child.proc.wait(timeout=30) == -signal.SIGKILL  # as Popen reports a signal
        assert child.proc.returncode == -signal.SIGKILL
        text = log.read_text()
        assert " DEBUG " in text  # the group's environment reached the child: its log level, to its stderr file
        assert "joined swarm" in text

        usage = forked.start("no-args", ["peer"])  # argparse refuses: exit status 2, as from the command line
        assert usage.proc.wait(timeout=60) == 2
