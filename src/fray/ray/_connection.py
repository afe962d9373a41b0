"""Ray's one connection per process, and the token authentication it needs.

``ray.init`` may run once per process, so every :class:`~fray.ray.RayClient` of the
process shares one connection (:data:`CONNECTION`): the first client that finds Ray
unconnected makes it, the last one to shut down ends it, and a connection the
program made itself is never ended by Fray.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fray.errors import ConfigError

__all__ = ["CONNECTION", "Connection", "auth_hint", "is_local_address", "prepare_token_auth"]


class Connection:
    """Ray's one connection per process, and whether Fray made it (then Fray also ends it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started_by_fray = False
        self.users = 0

    def acquire(self, address: str | None, namespace: str | None, init_kwargs: Mapping[str, Any]) -> None:
        """Count one more user; connect first (``ray.init``) if this process is not connected yet."""
        import ray

        with self.lock:
            if ray.is_initialized():
                if init_kwargs:
                    raise ConfigError(
                        "RayClient(ray_init_kwargs=...) only applies when Fray connects to Ray, but this process "
                        "is already connected; drop the arguments or create the client before calling ray.init"
                    )
            else:
                prepare_token_auth(address)
                try:
                    ray.init(address=address, namespace=namespace, **init_kwargs)
                except (ConnectionError, RuntimeError) as exc:
                    hint = auth_hint(exc)
                    if hint is None:
                        raise
                    raise ConfigError(f"cannot connect to Ray at {address or 'the default address'}: {hint}") from exc
                self.started_by_fray = True
            self.users += 1

    def release(self) -> None:
        """Count one user less; disconnect when it was the last and Fray made the connection."""
        import ray

        with self.lock:
            self.users -= 1
            if self.users == 0 and self.started_by_fray:
                self.started_by_fray = False
                ray.shutdown()


CONNECTION = Connection()


def prepare_token_auth(address: str | None) -> None:
    """Send this machine's Ray auth token to a local cluster, as Ray's CLI does, without user setup.

    Ray 2.60 starts clusters with token authentication on and keeps the token in
    ``~/.ray/auth_token``. A client process sends it only in ``RAY_AUTH_MODE=token``,
    which ``ray.init`` turns on by itself when it starts a cluster or finds one
    automatically, but not for an explicit address (argument or ``RAY_ADDRESS``): then
    ``ray.init`` fails with an authentication error. Fray turns token mode on when a
    token is available and the cluster is on this machine (the token file is then that
    cluster's); it never sends the local token to a remote address on its own. A
    token-mode client also talks to clusters without auth. An explicit
    ``RAY_AUTH_MODE`` always wins.
    """
    if os.environ.get("RAY_AUTH_MODE"):
        return
    token_path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    if not (os.environ.get("RAY_AUTH_TOKEN") or Path(token_path).is_file()):
        return
    if not is_local_address(address if address is not None else os.environ.get("RAY_ADDRESS")):
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    with contextlib.suppress(Exception):
        # Ray caches its config (the auth mode included) at import: refresh it, as Ray itself does.
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")


def is_local_address(address: str | None) -> bool:
    """True if ``address`` (as ``ray.init`` takes it) names a cluster on this machine."""
    if address in (None, "", "auto", "local"):
        return True
    assert address is not None
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return True
    with contextlib.suppress(OSError):
        own = {socket.gethostname(), socket.getfqdn(), socket.gethostbyname(socket.gethostname())}
        own |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
        return host in own
    return False


def auth_hint(exc: BaseException) -> str | None:
    """How to fix a failed connection when ``exc`` says the cluster wants a token; None otherwise."""
    text = f"{exc} {exc.__cause__}"
    if "uthenticat" in text or "auth token" in text.lower():
        return (
            "the Ray cluster requires token authentication: set RAY_AUTH_MODE=token and make its token "
            "available (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN); Fray only does this by itself "
            "for clusters on this machine"
        )
    return None
