"""The package's layers (docs/architecture.md) hold: no module imports a layer above its own.

cli, local, testing -> coordinator, peers -> pipeline, sync -> transport, swarm -> compression, models,
planner, data, emulate, sim (no networking) -> config, plan, errors, files. Imports inside functions
count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import geotrain

PACKAGE = Path(geotrain.__file__).parent

RANK = {
    "errors": 0, "files": 0, "plan": 0, "config": 0,
    "compression": 1, "models": 1, "planner": 1, "data": 1, "emulate": 1, "sim": 1,
    "transport": 2, "swarm": 2,
    "pipeline": 3, "sync": 3,
    "peers": 4, "coordinator": 4,
    "cli": 5, "local": 5, "testing": 5, "__main__": 5,
    "__init__": 0,  # the package itself: its version, no imports
}

# still open: the job schema builds its model, data and codecs through these (lazy) imports
KNOWN = {
    ("geotrain/config.py", "compression"),
    ("geotrain/config.py", "data"),
    ("geotrain/config.py", "models"),
}


def _layer(module: str) -> str:
    """``geotrain.sync.round`` -> ``sync``; ``geotrain`` itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> set[str]:
    out = set()
    for n in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "geotrain" and n.level == 0:
            out.add(_layer(n.module))
        elif isinstance(n, ast.Import):
            out |= {_layer(a.name) for a in n.names if a.name.split(".")[0] == "geotrain"}
    return out


def test_every_top_level_module_has_a_layer() -> None:
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    assert names <= set(RANK), sorted(names - set(RANK))


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        own = rel.parts[1].removesuffix(".py")
        for target in _imports(path):
            if RANK[target] > RANK[own] and (str(rel), target) not in KNOWN:
                upward.append(f"{rel} ({own}, layer {RANK[own]}) imports {target} (layer {RANK[target]})")
    assert not upward, "\n".join(upward)


def test_the_known_exceptions_are_still_needed() -> None:
    # an exception that is fixed leaves this list, so that it cannot come back unnoticed
    stale = [(f, t) for f, t in KNOWN if t not in _imports(PACKAGE.parent / f)]
    assert not stale, stale
