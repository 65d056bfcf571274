"""The pipeline's own messages measure a slow link: a hop through a rate-capped proxy, read at the receiver."""

from __future__ import annotations

import torch

from geotrain.pipeline.hop import HopSender
from geotrain.testing.faultproxy import Fault, FaultProxy, FaultProxyConfig
from geotrain.transport import Message, Transport, TransportConfig

CAP = 2e6  # bytes/s
SIZE = 200_000  # bytes per message: 0.1 s each at the cap, so a burst of them queues on the link


def test_messages_queued_on_a_capped_link_measure_it_at_the_receiver() -> None:
    rx = Transport(TransportConfig(), peer_id="rx", region="us").start()
    tx = Transport(TransportConfig(), peer_id="tx", region="eu").start()
    proxy = FaultProxy(FaultProxyConfig(target=rx.address, fault=Fault(kind="rate", rate_bytes_per_s=CAP))).start()
    hop = None
    try:
        tx.connect("rx", proxy.address, region="us")
        hop = HopSender(tx, "rx", codec="none", timeout_s=30.0, queue_size=8)
        for mb in range(12):
            hop.submit(Message(kind="pp.act", tag=(0, 1, mb), step=1, tensors={"x": torch.zeros(SIZE // 4)}))
        for mb in range(12):
            got = rx.recv("pp.act", (0, 1, mb), timeout=60)
            assert got.sender == "tx" and isinstance(got.meta["sent_at"], float)
        link = rx.inbound_links()["tx"]
        assert link.messages == 12 and link.queued >= 6, link
        assert link.bandwidth_bps is not None
        # the proxy lets no more than CAP through (a loaded machine can only make it slower)
        assert link.bandwidth_bps <= 1.5 * CAP, link
        assert "rx" not in tx.inbound_links()  # nothing stamped came back
    finally:
        if hop is not None:
            hop.close()
        proxy.close()
        tx.close()
        rx.close()
