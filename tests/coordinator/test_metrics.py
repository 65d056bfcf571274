from __future__ import annotations

import urllib.request

from geotrain.coordinator.metrics import MetricsServer


def test_metrics_endpoint_serves_latest_progress() -> None:
    server = MetricsServer(port=0).start()
    try:
        server({"event": "plan", "version": 2})
        server({"event": "progress", "tokens": 1234,
                "peers": {"QmA": {"step": 7, "loss": 2.5, "round": 1, "status": "training"}}})
        server({"event": "death", "peer_id": "QmB"})
        with urllib.request.urlopen(server.address, timeout=10) as r:
            body = r.read().decode()
        assert "geotrain_tokens_total 1234" in body
        assert "geotrain_plan_version 2" in body
        assert 'geotrain_peer_loss{peer="QmA"} 2.5' in body
        assert 'geotrain_peer_status{peer="QmA",status="training"} 1' in body
        assert "geotrain_peer_deaths_total 1" in body
    finally:
        server.close()
