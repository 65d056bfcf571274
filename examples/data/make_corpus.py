"""Write a JSONL corpus from text every machine has: the Python standard library's own modules.

One JSON object per line, ``{"text": ..., "source": "<module path>"}``: each
module's docstring and source is one document. Deterministic (sorted files,
the same Python version gives the same bytes), no download::

    python examples/data/make_corpus.py examples/data/corpus.jsonl --max-bytes 4000000

``examples/jobs/llama_bpe.toml`` trains on the file this writes.
"""

from __future__ import annotations

import argparse
import json
import os
import sysconfig
from pathlib import Path

_SKIP = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idlelib", "turtledemo"}


def write_corpus(out: str | Path, *, max_bytes: int = 4_000_000, max_doc_bytes: int = 20_000) -> int:
    """Write the corpus to ``out``; returns the number of documents. Long modules are cut into documents."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP)
        files.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    total = docs = 0
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            rel = path.relative_to(root).as_posix()
            for start in range(0, len(text), max_doc_bytes):
                piece = text[start:start + max_doc_bytes]
                if not piece.strip():
                    continue
                f.write(json.dumps({"text": piece, "source": rel}) + "\n")
                docs += 1
                total += len(piece)
                if total >= max_bytes:
                    return docs
    return docs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the JSONL file to write")
    p.add_argument("--max-bytes", type=int, default=4_000_000, help="stop after about this many characters")
    args = p.parse_args(argv)
    n = write_corpus(args.out, max_bytes=args.max_bytes)
    print(json.dumps({"event": "corpus", "path": args.out, "documents": n}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
