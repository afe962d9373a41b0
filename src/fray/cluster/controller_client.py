"""Reaching a Fray cluster's controller: the cluster token, and an RPC handle that rides out restarts.

Clients, workers, the launcher and the CLI all talk to the controller through
:func:`controller_client` (one raw RPC handle) or :func:`connect_controller` (one
shared, retrying handle per address and token). Nothing here imports the
controller's store or the worker daemon.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from fray.cluster.messages import CONTROLLER_ACTOR
from fray.errors import ActorUnavailableError, CallNotSentError
from fray.rpc.client import ActorClient, RpcOptions
from fray.rpc.registry import SYSTEM_NAMESPACE
from fray.rpc.resolver import FixedResolver

__all__ = [
    "CONTROLLER_RETRY_SECONDS",
    "OPS_ACTOR",
    "ControllerHandle",
    "connect_controller",
    "controller_client",
    "load_token",
    "ops_client",
]

#: The actor name (in the system namespace) of the controller's operator API (:mod:`fray.cluster.ops`).
OPS_ACTOR = "fray-ops"

_TOKEN_FILE = Path.home() / ".config" / "fray" / "token"

#: How long calls keep retrying while the controller is unreachable (e.g. restarting).
CONTROLLER_RETRY_SECONDS = 60.0

# Only submit() creates something; every other controller call can safely be repeated.
_NOT_IDEMPOTENT = frozenset({"submit"})


def load_token(token: str | bytes | None = None) -> bytes | None:
    """The cluster token: the argument, else ``FRAY_TOKEN``, else ``~/.config/fray/token``."""
    if token is not None:
        return token.encode() if isinstance(token, str) else token
    if os.environ.get("FRAY_TOKEN"):
        return os.environ["FRAY_TOKEN"].encode()
    try:
        return _TOKEN_FILE.read_text().strip().encode() or None
    except OSError:
        return None


def controller_client(address: str, token: str | bytes | None = None, timeout: float = 30.0) -> ActorClient[Any]:
    """A raw RPC handle on the controller at ``address`` (``host:port``): no retries beyond the RPC layer's."""
    resolver = FixedResolver({CONTROLLER_ACTOR: f"actor://{address}/{CONTROLLER_ACTOR}"}, namespace=SYSTEM_NAMESPACE)
    return ActorClient(resolver, CONTROLLER_ACTOR, RpcOptions(timeout=timeout), token=token)


def ops_client(address: str, token: str | bytes | None = None, timeout: float = 30.0) -> ActorClient[Any]:
    """A raw RPC handle on the controller's operator API (:mod:`fray.cluster.ops`) at ``address``."""
    resolver = FixedResolver({OPS_ACTOR: f"actor://{address}/{OPS_ACTOR}"}, namespace=SYSTEM_NAMESPACE)
    return ActorClient(resolver, OPS_ACTOR, RpcOptions(timeout=timeout), token=load_token(token))


class ControllerHandle:
    """Calls the controller, riding out its restarts.

    A call that provably was not sent is retried until ``retry_seconds`` (default
    :data:`CONTROLLER_RETRY_SECONDS`) pass; one that may have run is retried only if
    repeating it is harmless. Jobs and scripts keep the patient default, so a
    controller restart does not fail them; the CLI passes a short budget, so a
    controller that is not there is reported at once.
    """

    def __init__(self, address: str, token: bytes | None, retry_seconds: float = CONTROLLER_RETRY_SECONDS) -> None:
        self.address = address
        self.retry_seconds = retry_seconds
        self._rpc = controller_client(address, token)

    def bounded(self, timeout: float) -> Any:
        """The raw controller handle with a call timeout and no retries (for shutdown paths)."""
        return self._rpc.with_options(timeout=timeout)

    def __getattr__(self, method: str) -> Any:
        call = getattr(self._rpc, method)

        def retrying(*args: Any, **kwargs: Any) -> Any:
            deadline = time.monotonic() + self.retry_seconds
            delay = 0.02
            while True:
                try:
                    return call(*args, **kwargs)
                except ActorUnavailableError as exc:
                    may_have_run = not isinstance(exc, CallNotSentError)
                    if (may_have_run and method in _NOT_IDEMPOTENT) or time.monotonic() > deadline:
                        raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

        return retrying


# One controller connection per (address, token, retry budget) per process, shared by every handle.
_handles: dict[tuple[str, bytes | None, float], ControllerHandle] = {}
_handles_lock = threading.Lock()


def connect_controller(
    address: str, token: str | bytes | None = None, *, retry_seconds: float = CONTROLLER_RETRY_SECONDS
) -> ControllerHandle:
    """The process's shared, retrying handle on the controller at ``address`` (token: see :func:`load_token`).

    ``retry_seconds`` is how long a call keeps retrying while the controller is unreachable.
    """
    resolved = load_token(token)
    key = (address, resolved, retry_seconds)
    with _handles_lock:
        handle = _handles.get(key)
        if handle is None:
            handle = _handles[key] = ControllerHandle(address, resolved, retry_seconds)
        return handle
