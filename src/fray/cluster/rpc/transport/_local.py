"""The local transport: an actor server's second listener, for clients on the same host.

An :class:`~fray.cluster.rpc.server.ActorServer` also listens on a Unix socket in Linux's abstract
namespace (no file to create or clean up; gone with the process), under a random name it
tells authenticated clients through the ``local`` control operation. A client that can
connect to that name is on the same host (and network namespace), and moves its
connection there: the same handshake and frames, with fewer kernel layers per message and
large segments passed as memfds (see :mod:`fray.cluster.rpc.transport._memfd`). A client that cannot
connect stays on TCP.

``FRAY_RPC_LOCAL=0`` turns the local transport off (servers do not offer it, clients do
not use it), e.g. to measure TCP alone.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid

from fray.cluster.rpc import wire
from fray.cluster.rpc.transport import _memfd

__all__ = ["connect", "enabled", "listen"]


def enabled() -> bool:
    """True where the local transport exists (Linux) and is not turned off."""
    return sys.platform.startswith("linux") and _memfd.available() and os.environ.get("FRAY_RPC_LOCAL") != "0"


def listen() -> tuple[socket.socket, str] | None:
    """A listening abstract Unix socket under a fresh random name, or None where there is none."""
    if not enabled():
        return None
    name = f"fray-rpc-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind("\0" + name)
        listener.listen(512)
    except OSError:
        listener.close()
        return None
    return listener, name


def connect(name: str, timeout: float | None) -> socket.socket:
    """A socket connected to the local listener ``name``; OSError if it is not on this host."""
    if not enabled() or not name.startswith("fray-rpc-"):
        raise ConnectionRefusedError("no local transport")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect("\0" + name)
        wire.tune_socket(sock)
    except BaseException:
        sock.close()
        raise
    return sock
