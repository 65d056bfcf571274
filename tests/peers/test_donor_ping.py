"""A previous holder the new plan left out (not even a spare) is asked for state only if it answers a ping."""

from __future__ import annotations

from geotrain.peers.probe import answering, serve_probes
from geotrain.transport import Transport, TransportConfig


def test_only_holders_that_answer_a_ping_are_kept() -> None:
    asker = Transport(TransportConfig(), peer_id="asker").start()
    live = Transport(TransportConfig(), peer_id="live").start()
    gone = Transport(TransportConfig(), peer_id="gone").start()
    try:
        serve_probes(live)
        serve_probes(gone)
        asker.connect("live", live.address)
        asker.connect("gone", gone.address)
        gone_address = gone.address
        gone.close()  # its process died: the endpoint no longer answers
        asker.connect("gone", gone_address)
        assert answering(asker, {"live", "gone"}, timeout=2.0) == {"live"}
        assert answering(asker, set(), timeout=2.0) == set()
        assert answering(asker, {"never-connected"}, timeout=0.5) == set()  # a typed error, not a crash
    finally:
        asker.close()
        live.close()
