"""A Prometheus text endpoint for a running job (``geotrain run --metrics-port``).

It listens to the coordinator's events (the same ones the live view shows) and
serves the latest figures at ``/metrics`` in Prometheus' text format. Binds
127.0.0.1 by default; port 0 picks a free port (read back from ``address``).
"""

from __future__ import annotations

import http.server
import threading
from typing import Any

from geotrain.swarm.records import PeerStatus


def status_name(value: Any) -> str:
    """The name of a peer status as a progress event carries it (a :class:`PeerStatus` value), else "unknown"."""
    try:
        return PeerStatus(value).value
    except ValueError:
        return "unknown"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


class MetricsServer:
    """Collects coordinator events; serves them as Prometheus metrics."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._progress: dict[str, Any] = {}
        self._plan_version = 0
        self._deaths = 0
        self._joins = 0
        self._validation: float | None = None
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.rstrip("/") != "/metrics":
                    self.send_error(404)
                    return
                body = server.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = http.server.ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._http.serve_forever, name="gt-metrics", daemon=True)

    @property
    def address(self) -> str:
        host, port = self._http.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{name}:{port}/metrics"

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        with self._lock:
            if kind == "progress":
                self._progress = event
            elif kind in ("plan", "replan", "stop"):
                self._plan_version = int(event.get("version", self._plan_version))
            elif kind == "death":
                self._deaths += 1
            elif kind == "join":
                self._joins += 1
            elif kind == "validation":
                self._validation = float(event["loss"])

    def render(self) -> str:
        with self._lock:
            p = dict(self._progress)
            lines = [
                "# TYPE geotrain_tokens_total counter",
                f"geotrain_tokens_total {p.get('tokens', 0)}",
                "# TYPE geotrain_plan_version gauge",
                f"geotrain_plan_version {self._plan_version}",
                "# TYPE geotrain_peer_deaths_total counter",
                f"geotrain_peer_deaths_total {self._deaths}",
                "# TYPE geotrain_peer_joins_total counter",
                f"geotrain_peer_joins_total {self._joins}",
            ]
            if self._validation is not None:
                lines += ["# TYPE geotrain_validation_loss gauge", f"geotrain_validation_loss {self._validation}"]
            peers = p.get("peers", {})
            for name, key in (("step", "step"), ("round", "round"), ("loss", "loss")):
                lines.append(f"# TYPE geotrain_peer_{name} gauge")
                for pid, info in sorted(peers.items()):
                    value = info.get(key)
                    if value is not None:
                        lines.append(f'geotrain_peer_{name}{{peer="{_label(pid)}"}} {value}')
            lines.append("# TYPE geotrain_peer_status gauge")
            for pid, info in sorted(peers.items()):
                status = status_name(info.get("status"))
                lines.append(f'geotrain_peer_status{{peer="{_label(pid)}",status="{status}"}} 1')
        return "\n".join(lines) + "\n"
