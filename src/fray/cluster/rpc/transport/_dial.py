"""Opening an actor client's TCP socket: no Nagle delay, keepalive that notices a vanished host, tuned buffers.

:class:`fray.cluster.rpc._connection.Connection` runs the handshake over the socket made here.
"""

from __future__ import annotations

import socket

from fray.cluster.rpc import wire

__all__ = ["dial_tcp"]

# Dead peers whose host vanished (no RST ever comes) are detected by TCP keepalive after
# about IDLE + INTERVAL * COUNT seconds.
_KEEPALIVE_IDLE = 10
_KEEPALIVE_INTERVAL = 5
_KEEPALIVE_COUNT = 3


def dial_tcp(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP socket connected to ``host:port`` within ``timeout`` seconds, with Fray's options set."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, _KEEPALIVE_IDLE)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, _KEEPALIVE_INTERVAL)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, _KEEPALIVE_COUNT)
        wire.tune_socket(sock)
    except BaseException:
        sock.close()
        raise
    return sock
