"""The live view of a running job (rich), fed by the coordinator's events."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from geotrain.coordinator.metrics import status_name


class LiveView:
    """Renders progress events as a table; other events as log lines above it."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=False)
        self._live: Live | None = None
        self._progress: dict[str, Any] = {}
        self._plan: dict[str, Any] = {}
        self._regions: dict[str, str] = {}
        self._lines: list[str] = []
        self._last_validation: tuple[int, int] | None = None
        self._started = time.time()

    def __enter__(self) -> LiveView:
        self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(None, None, None)

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "progress":
            self._progress = event
        elif kind == "join":
            self._regions[event["peer_id"]] = event.get("region", "?")
            self._log(f"[green]join[/] {event['peer_id'][:12]} in {event.get('region')} ({event.get('device', '')[:40]})")
        elif kind in ("plan", "replan"):
            self._plan = event
            # two short lines rather than one that a narrow terminal wraps mid-figure
            self._log(
                f"[cyan]{kind}[/] v{event['version']} ({event.get('reason')}): {event.get('pipelines')} pipelines x "
                f"{event.get('stages')} stages, {event.get('spares', 0)} spares"
            )
            links = event.get("links") or {}
            estimated = f", {links['estimated']} of {links['estimated'] + links['measured']} peer pairs' links " \
                        "estimated from their regions" if links.get("estimated") else ""
            self._log(f"      predicted {event.get('predicted_tokens_per_s') or 0:,.0f} tokens/s{estimated}")
            for i, line in enumerate(event.get("layout", [])):
                self._log(f"      pipeline {i}: {line}")
        elif kind == "validation" and (event["step"], event["round"]) != self._last_validation:
            self._last_validation = (event["step"], event["round"])
            self._log(f"[magenta]validation[/] global model at step {event['step']} (round {event['round']}): "
                      f"loss {event['loss']:.3f}")
        elif kind == "waiting":
            self._log(f"[yellow]waiting[/] {event.get('peers')} peers not plannable yet (gives up in "
                      f"{event.get('wait_s')}s): {event.get('reason')}")
        elif kind == "death":
            self._log(f"[red]death[/] {event['peer_id'][:12]}")
        elif kind in ("stop", "reattach", "error", "start"):
            self._log(f"[yellow]{kind}[/] " + ", ".join(f"{k}={v}" for k, v in event.items() if k != "event"))
        if self._live is not None:
            self._live.update(self._render())

    def _log(self, line: str) -> None:
        self._lines.append(f"[dim]{time.time() - self._started:7.1f}s[/] {line}")
        self._lines = self._lines[-16:]

    def _render(self) -> Group:
        table = Table(title="geotrain job", expand=False)
        for col in ("peer", "region", "step", "round", "loss", "status"):
            table.add_column(col)
        peers = self._progress.get("peers", {})
        for pid, p in sorted(peers.items(), key=lambda kv: kv[0]):
            loss = p.get("loss")
            table.add_row(
                pid[:12],
                self._regions.get(pid, "?"),
                str(p.get("step")),
                str(p.get("round")),
                "" if loss is None else f"{loss:.3f}",
                status_name(p.get("status")),
            )
        head = Text.from_markup(
            f"t={self._progress.get('t_s', 0):.0f}s  tokens={self._progress.get('tokens', 0):,}  "
            f"plan v{self._plan.get('version', '-')}"
        )
        return Group(*(Text.from_markup(x) for x in self._lines), head, table)
