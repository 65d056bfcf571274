"""geotrain.local.procs: a child forked from the preloaded server behaves like a fresh ``python -m geotrain``."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from geotrain.local.procs import ChildGroup, ForkedProc, netns_of

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


def _die_holding_hivemind_update_lock() -> None:
    """A forked child killed in the middle of an MPFuture update: it exits holding the server's lock."""
    from hivemind.utils.mpfuture import MPFuture

    MPFuture._update_lock.acquire()
    os._exit(0)


def test_a_child_killed_holding_a_hivemind_lock_does_not_block_the_next_one() -> None:
    """hivemind makes process-shared locks at import; forked children must not share the server's."""
    with ChildGroup(preload=True) as forked:
        forked.start("warm", ["--version"]).proc.wait(timeout=60)  # the server is up, with PRELOAD imported
        ctx = multiprocessing.get_context("forkserver")
        poisoner = ctx.Process(target=_die_holding_hivemind_update_lock)
        poisoner.start()
        poisoner.join(timeout=60)
        assert poisoner.exitcode == 0
        # the DHT process reports ready through an MPFuture update, under that lock when it is shared
        forked.start("dht", ["dht"]).wait_event("ready", 60)


def test_a_signal_right_after_start_reaches_a_forked_child() -> None:
    """Before the child's setsid() its process group does not exist yet: the signal goes to the child itself."""
    with ChildGroup(preload=True) as forked:
        child = forked.start("dht", ["dht"])
        child.signal(signal.SIGKILL)
        assert child.proc.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.parametrize("preload", [False, True], ids=["fresh", "forked"])
def test_a_child_that_exits_names_the_end_of_its_stderr(tmp_path: Path, preload: bool) -> None:
    log = tmp_path / "run.err"
    with ChildGroup(preload=preload) as group:
        child = group.start("run", ["run", str(tmp_path / "job.toml")], stderr_path=str(log))  # no --initial-peers
        with pytest.raises(RuntimeError, match=r"run exited with 2") as e:
            child.wait_event("report", 60)
    # what the command printed before it exited, not only its stdout: the reason a test failed
    assert "required: --initial-peers" in str(e.value) and str(log) in str(e.value)
    assert "required: --initial-peers" in child.stderr_tail()


@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2 (a namespace)")
def test_a_child_behind_ip_netns_exec_is_forked_into_the_namespace() -> None:
    """``ip netns exec NAME`` as a prefix: the forked child enters NAME itself, and so do its DHT and daemons."""
    name = f"gt-tfork{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        inode = os.stat(f"/run/netns/{name}").st_ino
        with ChildGroup(preload=True) as forked:
            child = forked.start("dht", ["dht", "--host", "127.0.0.1"], prefix=["ip", "netns", "exec", name])
            ready = child.wait_event("ready", 60)
            assert isinstance(child.proc, ForkedProc)
            assert os.readlink(f"/proc/{child.pid}/ns/net") == f"net:[{inode}]"
            assert os.readlink(f"/proc/{os.getpid()}/ns/net") != f"net:[{inode}]"  # this process stayed out
            port = int(ready["maddrs"][0].split("/tcp/")[1].split("/")[0])
            listening = subprocess.run(["ip", "netns", "exec", name, "ss", "-Hltn", f"sport = :{port}"],
                                       capture_output=True, text=True, check=True).stdout
            assert f":{port}" in listening  # the DHT's daemon, started by the child, listens in the namespace
        with ChildGroup(preload=True) as forked:  # a namespace that does not exist: the child fails, saying so
            gone = forked.start("dht", ["dht"], prefix=["ip", "netns", "exec", name + "-gone"])
            with pytest.raises(RuntimeError, match="exited with 1"):
                gone.wait_event("ready", 60)
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def test_only_an_exact_ip_netns_exec_prefix_names_a_namespace() -> None:
    assert netns_of(["ip", "netns", "exec", "eu"]) == "eu"
    assert netns_of(["/usr/sbin/ip", "netns", "exec", "eu"]) == "eu"
    assert netns_of([]) is None
    assert netns_of(["ip", "netns", "exec", "eu", "nice"]) is None
    assert netns_of(["sudo", "ip", "netns", "exec"]) is None


def test_a_forked_child_starts_its_own_processes_as_a_fresh_interpreter_does(tmp_path: Path) -> None:
    """The fork server's start method is not the child's default: hivemind's averager starts a default Process."""
    script = tmp_path / "probe_start_method.py"
    script.write_text("import json, multiprocessing\n"
                      "print(json.dumps({'event': 'ready', 'method': multiprocessing.get_start_method()}))\n")
    env = {"PYTHONPATH": str(tmp_path)}
    with ChildGroup(preload=True, env=env) as forked, ChildGroup(env=env) as fresh:
        child = forked.start("probe", [], module="probe_start_method")
        plain = fresh.start("probe", [], module="probe_start_method")
        assert isinstance(child.proc, ForkedProc)
        assert child.wait_event("ready", 60)["method"] == plain.wait_event("ready", 60)["method"]
