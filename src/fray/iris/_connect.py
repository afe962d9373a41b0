"""Which Iris client a Fray object talks through: the task's own context, or one per controller address."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from fray.errors import ConfigError

if TYPE_CHECKING:
    from iris.client import IrisClient as IrisLib

__all__ = ["controller_url", "in_task", "iris_client", "task_controller"]

_lock = threading.Lock()
_remote: dict[str, IrisLib] = {}


def in_task() -> bool:
    """True inside an Iris task: Iris sets these two variables on every task it starts."""
    return bool(os.environ.get("IRIS_TASK_ID")) and bool(os.environ.get("IRIS_CONTROLLER_ADDRESS"))


def controller_url(address: str) -> str:
    """``HOST:PORT`` as the URL Iris's client takes."""
    return address if "://" in address else f"http://{address}"


def task_controller() -> str | None:
    """``HOST:PORT`` of the controller that started this task, or None outside a task."""
    if not in_task():
        return None
    return urlsplit(controller_url(os.environ["IRIS_CONTROLLER_ADDRESS"])).netloc or None


def iris_client(address: str | None) -> IrisLib:
    """The Iris client for the controller at ``address`` (``HOST:PORT``; None: this task's own).

    Inside a task, the controller that started it is reached through the task's Iris
    context, which carries the task's credentials and makes submissions child jobs.
    """
    if in_task() and (address is None or address == task_controller()):
        from iris.client.client import get_iris_ctx

        ctx = get_iris_ctx()
        if ctx is not None and ctx.client is not None:
            return ctx.client
    if address is None:
        raise ConfigError("outside an Iris task the Iris backend needs the controller's address: use iris://HOST:PORT")
    with _lock:
        client = _remote.get(address)
        if client is None:
            from iris.client import IrisClient as IrisLib

            client = IrisLib.remote(controller_url(address))
            _remote[address] = client
        return client
