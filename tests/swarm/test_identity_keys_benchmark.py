"""Identity files, swarm keys and the compute benchmark (no network)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from geotrain.errors import ConfigError
from geotrain.swarm.identity import Identity, peer_id_from_public_key


def test_identity_is_created_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "peer.key"
    first = Identity.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = Identity.load_or_create(path)
    assert again.peer_id == first.peer_id and again.private_key_der == first.private_key_der
    assert Identity.ephemeral().peer_id != first.peer_id


def test_peer_id_is_the_libp2p_id_and_recoverable_from_the_owner_key(tmp_path: Path) -> None:
    from hivemind.p2p import PeerID

    path = tmp_path / "peer.key"
    ident = Identity.load_or_create(path)
    assert PeerID.from_identity(path.read_bytes()).to_base58() == ident.peer_id
    assert peer_id_from_public_key(ident.owner_public_key()) == ident.peer_id
    # the hivemind signer holds the same key
    assert ident.signature_validator().local_public_key == b"[owner:" + ident.owner_public_key() + b"]"


def test_a_file_that_is_not_an_identity_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.key"
    bad.write_bytes(b"hello")
    with pytest.raises(ConfigError, match="not a geotrain/hivemind identity"):
        Identity.load_or_create(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        Identity.load_or_create(tmp_path / "missing-dir" / "x.key")


def test_keygen_writes_a_private_32_byte_key(tmp_path: Path) -> None:
    from geotrain.cli import main
    from geotrain.swarm.keys import load_swarm_key

    out = tmp_path / "swarm.key"
    assert main(["keygen", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    key = load_swarm_key(out)
    assert len(key) == 32
    assert main(["keygen", str(out)]) == 2  # refuses to clobber
    assert load_swarm_key(out) == key
    assert main(["keygen", "--force", str(out)]) == 0
    assert load_swarm_key(out) != key
    out.write_text("short\n")
    with pytest.raises(ConfigError, match="not a swarm key"):
        load_swarm_key(out)


def test_compute_benchmark_runs_its_budget_and_is_plausible() -> None:
    from geotrain.peers.benchmark import BenchmarkConfig, measure_compute

    r = measure_compute(BenchmarkConfig(device="cpu", size=64, max_seconds=0.2))
    assert r.device_type == "cpu" and r.device.startswith("cpu")
    assert r.seconds >= 0.2 and r.matmuls >= 1  # it stops at its deadline: between batches of ~1/20 of it
    assert 1e6 < r.flops < 1e15  # a CPU does between a megaflop and a petaflop per second
    assert r.memory_bytes > 2**26
    with pytest.raises(ConfigError, match="size"):
        BenchmarkConfig(size=3)
    with pytest.raises(ConfigError, match="device"):
        BenchmarkConfig(device="tpu")


def test_torch_warm_up_runs_in_a_fresh_process_and_leaves_meta_builds_initialised() -> None:
    # a fresh interpreter, so the one-time initialisation really happens inside warm_up_torch
    import subprocess
    import sys

    code = (
        "import torch; from geotrain.peers.benchmark import warm_up_torch\n"
        "import sys; before = set(sys.modules); s = warm_up_torch('cpu'); assert s > 0\n"
        "after = set(sys.modules) - before; assert any(m.startswith('torch._decomp') for m in after), sorted(after)[:20]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
