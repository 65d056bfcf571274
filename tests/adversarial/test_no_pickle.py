"""Item 20: nothing in the package can unpickle. A static scan, with a control that it catches offenders.

The live half of item 20 (a ``__reduce__`` payload sent to a running peer as a
header, a tensor buffer, a codec name and a request field; nothing executes)
is in :mod:`tests.adversarial.test_live_peer`; the transport's unit case is
``tests/transport/test_bad_input.py::...[pickle_payload]``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import geotrain

PACKAGE = Path(geotrain.__file__).parent

# modules whose loaders run code from the bytes they read
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib", "jsonpickle"}
UNSAFE_METHODS = {"recv_pyobj", "recv_serialized", "read_pickle"}


def _is_true(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def offences(source: str, filename: str = "<src>") -> list[str]:
    """Every way ``source`` could unpickle: unsafe imports, unsafe calls, torch/numpy loads without safety."""
    out: list[str] = []
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            out += [f"{where} imports {a.name}" for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in UNSAFE_MODULES:
            out.append(f"{where} imports from {node.module}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            kw = {k.arg: k.value for k in node.keywords}
            if name in UNSAFE_METHODS:
                out.append(f"{where} calls {name}")
            elif name == "load" and owner == "torch" and not ("weights_only" in kw and _is_true(kw["weights_only"])):
                out.append(f"{where} calls torch.load without weights_only=True")
            elif name == "load" and owner in ("np", "numpy") and "allow_pickle" in kw and not (
                isinstance(kw["allow_pickle"], ast.Constant) and kw["allow_pickle"].value is False
            ):
                out.append(f"{where} calls numpy.load with allow_pickle")
            elif name in ("loads", "load", "Unpickler") and owner in UNSAFE_MODULES:
                out.append(f"{where} calls {owner}.{name}")
    return out


def test_the_package_never_unpickles() -> None:
    found: list[str] = []
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50  # the scan sees the whole package
    for path in files:
        found += offences(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import pickle",
        "from pickle import loads",
        "import dill as d",
        "import torch\ntorch.load(f)",
        "import torch\ntorch.load(f, weights_only=False)",
        "import torch\ntorch.load(f, map_location='cpu')",
        "sock.recv_pyobj()",
        "import numpy as np\nnp.load(f, allow_pickle=True)",
        "marshal.loads(b)",
    ],
)
def test_the_scan_catches_each_way_in(source: str) -> None:
    assert offences(source), source


def test_the_scan_passes_safe_loads() -> None:
    assert not offences("import torch\ntorch.load(f, weights_only=True, map_location='cpu')")
    assert not offences("import numpy as np\nnp.load(f)\nmsgpack.unpackb(b, raw=False)")
