"""Shared by the emulation tests: skip cleanly where network namespaces cannot be made."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest


@functools.cache
def netns_unavailable() -> str | None:
    """Why this machine cannot run the netns tests, or None when it can (tries a real namespace once)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    name = f"gt-tcheck{os.getpid()}-x"
    try:
        done = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run ip netns: {e}"
    if done.returncode != 0:  # root in a container without CAP_NET_ADMIN lands here
        return f"cannot create a network namespace: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return None


requires_netns = pytest.mark.skipif(netns_unavailable() is not None, reason=str(netns_unavailable()))
