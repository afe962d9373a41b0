"""Fault injection for tests of code that uses Fray: make the failures a cluster has, on purpose.

:func:`kill_actor` kills an actor's process the way a crash would (the local backend,
whose actors share the script's process, simulates it by killing the actor's threads).
Later additions (preempting a job, losing a worker) belong here too.
"""

from __future__ import annotations

from typing import Any

from fray.errors import ConfigError

__all__ = ["kill_actor"]


def kill_actor(handle: Any) -> None:
    """Kill the process of the actor behind ``handle``, as a crash would; returns once it is dead.

    What follows is what follows a real crash: calls in flight fail with
    :class:`~fray.errors.ActorDiedError` (or are sent again, see
    ``ActorConfig.max_task_retries``); the actor is restarted, its constructor run
    anew, if ``ActorConfig.max_restarts`` allows, and later calls reach the new
    instance; otherwise its job is FAILED and every call fails at once. Unlike
    ``terminate()``, the actor gets no warning (``shutdown_requested`` is not set).
    Raises :class:`~fray.errors.ConfigError` where the backend cannot kill one actor's
    process, and ``TypeError`` for something that is not an actor handle.
    """
    if not hasattr(type(handle), "_fray_ready"):
        raise TypeError(f"kill_actor() takes an actor handle (from client.create_actor), got {handle!r}")
    kill = getattr(type(handle), "_fray_kill", None)
    if kill is None:
        raise ConfigError(
            f"kill_actor({handle!r}): this backend ({type(handle).__module__}) cannot kill one actor's process"
        )
    kill(handle)
