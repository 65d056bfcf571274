"""The ``geotrain`` command.

Each subcommand lives in its own module ``geotrain.cli.<name>`` exposing
``register(subparsers)``, which adds its parser and sets ``handler`` to a
function ``(args) -> int``. Modules import heavy dependencies (torch,
hivemind) inside their handler so ``geotrain --help`` stays fast.

This package is the only place that reads environment variables and the only
place that prints for humans; library code logs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from geotrain import __version__
from geotrain.errors import GeotrainError


def given(**options: object) -> dict[str, object]:
    """The options a user set (flags whose parser default is None and were left out are dropped), so a config's
    own defaults hold and are written once, in the config."""
    return {k: v for k, v in options.items() if v is not None}


# Order is the order shown in --help.
COMMANDS = ("demo", "run", "check", "export", "peer", "dht", "status", "plan", "simulate", "emulate", "keygen")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geotrain",
        description="Train one PyTorch model across regions over hivemind's DHT.",
    )
    parser.add_argument("--version", action="version", version=f"geotrain {__version__}")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("GEOTRAIN_LOG_LEVEL", "WARNING"),
        help="python logging level (env GEOTRAIN_LOG_LEVEL); default WARNING",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"geotrain.cli.{name}").register(sub)
    return parser


def _die_with_parent() -> None:
    """``GEOTRAIN_PARENT_PID`` (set by geotrain.local's ChildGroup, e.g. for the demo's peers): end
    this process when that parent dies, even if it was killed outright and reaped nothing (Linux)."""
    parent = os.environ.get("GEOTRAIN_PARENT_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    if str(os.getppid()) != parent:  # the parent died before the line above
        sys.exit(0)


def _stacks_on_sigusr1() -> None:
    """``kill -USR1 PID``: every thread's Python stack to stderr, the process going on (a peer that hangs
    says where)."""
    import faulthandler
    import signal

    if not hasattr(signal, "SIGUSR1"):
        return
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    except (AttributeError, OSError, ValueError):  # a stderr with no file descriptor (captured, in-process)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    _die_with_parent()
    _stacks_on_sigusr1()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except GeotrainError as e:
        print(f"geotrain {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
