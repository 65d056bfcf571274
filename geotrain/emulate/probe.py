"""Measure what an emulation really delivers: a TCP bulk transfer between two regions.

Used by ``geotrain emulate probe`` and the tests to check that a shaped link
carries its configured rate on this machine. Goodput sits a few percent under
the htb rate because htb counts Ethernet/IP/TCP headers (about 66 bytes per
1448-byte segment, so ~95.6%).
"""

from __future__ import annotations

import threading
import time

from geotrain.emulate.netns import Emulation
from geotrain.errors import EmulationError

CHUNK = 1 << 16


def tcp_goodput(em: Emulation, src: str, dst: str, nbytes: int, *, timeout: float = 30.0) -> float:
    """Send ``nbytes`` (rounded down to 64 KiB) from region ``src`` to region ``dst``; bytes/s at the receiver.

    The clock starts at the first received byte, so connection setup does not
    count as bandwidth. Raises :class:`EmulationError` if the transfer does
    not finish within ``timeout`` seconds.
    """
    chunks = max(1, nbytes // CHUNK)
    srv = em.socket(dst)
    result: dict[str, float] = {}
    errors: list[BaseException] = []
    done = threading.Event()
    try:
        srv.settimeout(timeout)
        srv.bind((em.address(dst), 0))
        srv.listen(1)

        def receive() -> None:
            try:
                conn, _ = srv.accept()
                with conn:
                    conn.settimeout(timeout)
                    got, first = 0, 0.0
                    while chunk := conn.recv(CHUNK):
                        if not got:
                            first = time.monotonic()
                        got += len(chunk)
                    result["rate"] = got / max(time.monotonic() - first, 1e-9)
                    result["bytes"] = got
            except OSError as e:
                errors.append(e)
            finally:
                done.set()

        threading.Thread(target=receive, daemon=True, name=f"probe-{src}-{dst}").start()
        with em.socket(src) as cli:
            cli.settimeout(timeout)
            try:
                cli.connect(srv.getsockname())
                payload = b"\x5a" * CHUNK
                for _ in range(chunks):
                    cli.sendall(payload)
            except OSError as e:
                raise EmulationError(f"probe {src} -> {dst}: {e}") from None
        if not done.wait(timeout):
            raise EmulationError(f"probe {src} -> {dst}: receiver did not finish within {timeout}s")
    finally:
        srv.close()
    if errors:
        raise EmulationError(f"probe {src} -> {dst}: receiver failed: {errors[0]}")
    if result.get("bytes") != chunks * CHUNK:
        raise EmulationError(f"probe {src} -> {dst}: received {result.get('bytes')} of {chunks * CHUNK} bytes")
    return result["rate"]
