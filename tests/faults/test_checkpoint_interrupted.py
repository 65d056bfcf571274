"""Item 11: a checkpoint write interrupted (process killed mid-save; file-size limit hit): resume picks
the last complete checkpoint and loads it verified.

Step 10 is saved whole first. A writer process then saves step 20: its first
group entry completes, the second is cut, by SIGKILL while the file is being
written, or by ``RLIMIT_FSIZE``. Step 20 then lacks blocks, so
:func:`~geotrain.peers.checkpoint.latest_complete` must answer 10, and loading
10 must give exactly what was saved. The end-to-end resume path (a job stopped
after round k resumes at k + 1) is ``tests/coordinator/test_job_e2e.py``.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from geotrain.local.procs import ChildGroup
from geotrain.peers import checkpoint
from geotrain.sync.state import digest
from tests.faults.ckpt_writer import group_state

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

BLOCKS = 4


def _save_complete(root: Path, step: int) -> None:
    for a, b in ((0, 2), (2, 4)):
        checkpoint.save_group(root, group_state(step, a, b, 0.25), start=a, end=b)


def _assert_resumes_at_10(root: Path) -> None:
    assert checkpoint.latest_complete(root, BLOCKS) == 10
    got = checkpoint.load(root, 10, job_id="job")
    want = {**group_state(10, 0, 2, 0.25).params, **group_state(10, 2, 4, 0.25).params}
    assert digest(got.params) == digest(want)


def test_killed_mid_save_resumes_from_the_last_complete_step(children: ChildGroup, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _save_complete(root, 10)
    w = children.start("writer", ["--root", str(root), "--step", "20", "--blocks", "0,2", "2,4",
                                  "--mib", "0.25", "128"], module="tests.faults.ckpt_writer")
    w.wait_event("ready", 60)
    assert w.wait_event("writing", 60)["blocks"] == [0, 2]
    assert w.wait_event("writing", 60)["blocks"] == [2, 4]
    # the big entry is being written (serialised in memory first, then the temporary file): cut it there
    d = checkpoint.step_dir(root, 20)
    deadline = time.monotonic() + 60
    while not any(d.glob(".b2-4.safetensors.*")) and time.monotonic() < deadline:
        time.sleep(0.002)  # polling a file system, not waiting to assert
    children.kill(w, signal.SIGKILL)
    assert not (d / "b2-4.json").exists(), "the write finished before the kill; raise --mib"
    assert (d / "b0-2.json").exists()  # step 20 is half there
    _assert_resumes_at_10(root)


def test_file_size_limit_mid_save_resumes_from_the_last_complete_step(children: ChildGroup, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _save_complete(root, 10)
    w = children.start("writer", ["--root", str(root), "--step", "20", "--blocks", "0,2", "2,4",
                                  "--mib", "0.25", "8", "--fsize-limit", str(2 << 20)], module="tests.faults.ckpt_writer")
    failed = w.wait_event("failed", 60)
    assert failed["blocks"] == [2, 4] and "File too large" in failed["error"]
    assert w.proc.wait(timeout=30) == 1
    d = checkpoint.step_dir(root, 20)
    assert (d / "b0-2.json").exists() and not (d / "b2-4.json").exists()
    assert not list(d.glob(".b2-4.safetensors.*"))  # the cut temporary file was cleaned up
    _assert_resumes_at_10(root)


def test_a_truncated_or_altered_entry_is_not_complete(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _save_complete(root, 10)
    _save_complete(root, 20)
    pt = checkpoint.step_dir(root, 20) / "b2-4.safetensors"
    pt.write_bytes(pt.read_bytes()[:-100])  # truncated after the manifest was written
    _assert_resumes_at_10(root)
    _save_complete(root, 30)
    pt = checkpoint.step_dir(root, 30) / "b0-2.safetensors"
    data = bytearray(pt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pt.write_bytes(bytes(data))
    assert checkpoint.latest_complete(root, BLOCKS) == 10
