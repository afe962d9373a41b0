"""How fast Fray learns that a Monarch actor's process died, and what Monarch does about it.

Process-wide settings, applied once by :func:`configure` before Fray creates its
first mesh (each only if the user did not set the variable; Monarch reads them when
it is imported, so :func:`configure` reloads its configuration from the environment;
every process Fray starts inherits them, so meshes created inside jobs and actors
are supervised the same way):

* ``HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY`` (Monarch: 10 s; Fray: 500 ms):
  how often Monarch's mesh controller asks a mesh's processes for their state. With
  Monarch's default a killed actor process surfaced ~10 s later.
* ``HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE`` (Monarch: 30 s; Fray: 1 s): how long
  that question may go unanswered. When the process dies while a poll is waiting
  for its answer, the poll waits out this limit before the death is reported; with
  Monarch's default that made 1 kill in 3 surface after 30 s. The process agent
  answers from Monarch's native runtime, not from Python: an actor method holding
  the GIL for 8 s was not mistaken for a dead one (measured with the 1 s limit).

Measured in ``benchmarks/monarch.py``.

Monarch also has a process-wide **unhandled-fault hook**: a mesh failure that no
actor handles reaches the root client's ``monarch.actor.unhandled_fault_hook``,
whose default exits the process. Fray installs a hook that hands failures of meshes
it created to their watcher (which fails the actor's job and its callers with
``ActorDiedError``) and passes every other failure to the hook that was there
before. Failures of meshes Fray stopped on purpose are dropped. The failure of a
mesh's internal ``logger`` actors, which always dies with the processes of a mesh
that reports for itself, is not escalated once Fray created a mesh in this process.
Nor is a call to a Fray actor that had stopped: Monarch fails the call (Fray raises
``ActorDiedError`` for it) and also reports the message as undeliverable, as a
failure of the process's own client actor, which its default hook answers by
ending the process.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any

import monarch.actor
from monarch._rust_bindings.monarch_hyperactor.config import reload_config_from_env

__all__ = [
    "DEFAULT_POLL",
    "POLL_ENV",
    "SETTINGS",
    "call_from_here",
    "configure",
    "handle",
    "reason_of",
    "unwatch",
    "watch",
]

logger = logging.getLogger(__name__)

#: The environment variable that sets Monarch's supervision poll interval.
POLL_ENV = "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"
#: Fray's default for it: a dead actor process shows as an error within about this long.
DEFAULT_POLL = "500ms"
#: Monarch settings Fray changes (environment variable -> Fray's default); the user's own values win.
SETTINGS: dict[str, str] = {
    POLL_ENV: DEFAULT_POLL,
    "HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE": "1s",
}

_lock = threading.Lock()
_configured = False
_previous_hook: Callable[[Any], None] | None = None
_watchers: dict[str, Callable[[str], None]] = {}
# The spawn names Fray gives its actor meshes (see MonarchClient): "fray", letters and digits, 12 hex digits.
_FRAY_MESH = re.compile(r"fray[A-Za-z0-9]*[0-9a-f]{12}")
_calling = False  # this process calls Fray actors through handles it did not create
# How Monarch reports a message it could not deliver (the client actor's own failure, with no mesh name).
_UNDELIVERABLE = re.compile(r"undeliverable message for ([A-Za-z0-9_]+)\.")


def configure() -> None:
    """Apply Fray's supervision settings to this process (once; later calls do nothing)."""
    global _configured, _previous_hook
    with _lock:
        if _configured:
            return
        for name, value in SETTINGS.items():
            os.environ.setdefault(name, value)
        reload_config_from_env()
        _previous_hook = monarch.actor.unhandled_fault_hook
        monarch.actor.unhandled_fault_hook = _fault_hook
        _configured = True


def call_from_here() -> None:
    """This process calls Fray actors it does not own (handles unpickled here, e.g. in a job).

    Monarch tells every process that called an actor when its mesh fails, and its default
    hook ends that process (a KeyboardInterrupt in the main thread). For a Fray actor the
    failure is the call's business -- it raises ActorDiedError -- so Fray's hook takes it here too.
    """
    global _calling
    configure()
    _calling = True


def watch(spawn_name: str, on_failure: Callable[[str], None]) -> None:
    """Call ``on_failure(reason)`` when the actor mesh spawned as ``spawn_name`` fails.

    The callback runs on a Monarch thread: it must only record and schedule, never block.
    """
    with _lock:
        _watchers[spawn_name] = on_failure


def unwatch(spawn_name: str) -> None:
    """The mesh spawned as ``spawn_name`` is being stopped on purpose: its failures are expected from now on.

    They are still handled (dropped), never escalated: the processes Fray stops report as failed.
    """
    with _lock:
        if spawn_name in _watchers:
            _watchers[spawn_name] = _expected


def _expected(reason: str) -> None:
    logger.debug("a monarch mesh Fray stopped reported: %s", reason)


def handle(failure: Any) -> bool:
    """Route a Monarch ``MeshFailure`` to Fray's watcher of that mesh; True if Fray handled it."""
    # Monarch names an actor mesh "{spawn name}-{suffix}"; Fray's spawn names are letters and digits only.
    base = str(failure.mesh_name).rsplit("-", 1)[0]
    with _lock:
        watcher = _watchers.get(base)
        watching = bool(_watchers)  # entries stay (as _expected) once a mesh was stopped
    if watcher is not None:
        watcher(reason_of(failure))
        return True
    if _calling and _FRAY_MESH.fullmatch(base):
        logger.debug("a Fray actor this process called failed (its calls say so): %s", reason_of(failure))
        return True
    if base == "logger" and watching:
        logger.debug("monarch logger mesh failed (its processes' actor meshes report for themselves): %s", failure)
        return True
    if watching or _calling:
        # A call sent to a Fray actor that stopped meanwhile (e.g. from a job holding its handle): Monarch
        # fails the call -- Fray raises ActorDiedError for it -- and also reports the message as
        # undeliverable, as a failure of this process's client actor that would end the process.
        targets = _UNDELIVERABLE.findall(_report_text(failure))
        if targets and all(_FRAY_MESH.fullmatch(target) for target in targets):
            logger.debug("a call to a Fray actor that had stopped was undeliverable (the call says so): %s", targets)
            return True
    return False


def _fault_hook(failure: Any) -> None:
    if handle(failure):
        return
    previous = _previous_hook
    if previous is not None:
        previous(failure)


def _report_text(failure: Any) -> str:
    """The whole text of a Monarch failure's report."""
    return str(failure.report()) if hasattr(failure, "report") else str(failure)


def reason_of(failure: Any) -> str:
    """The one-line reason of a Monarch failure or supervision error, e.g. ``... failed: Killed(sig=9)``."""
    lines = [line.strip() for line in _report_text(failure).splitlines() if line.strip()]
    return lines[-1] if lines else str(failure)
