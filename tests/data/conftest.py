from __future__ import annotations

import json
from pathlib import Path

import pytest

WORDS = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
)


def sentence(i: int, n: int = 12) -> str:
    """A deterministic pseudo-sentence: document ``i`` of a tiny corpus."""
    return " ".join(WORDS[(i * 7 + k * k + k * i) % len(WORDS)] for k in range(n)) + f" {i}."


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({field: t, "id": len(t)}) + "\n")
    return path


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    """A fresh cache root (``tokens/``, ``tokenizers/``) per test: nothing leaks from ~/.cache."""
    return tmp_path / "cache"
