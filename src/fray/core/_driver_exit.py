"""What happens to a script's jobs and actors when it exits: one rule for every backend, and the notice it prints.

The rule (also in the README and ``docs/architecture.md``):

* **Jobs outlive the script** that submitted them, wherever the backend runs them
  outside the script: on a Fray cluster (``fray://``) and on Iris every job, on Ray the
  binary jobs (Ray's job API). ``client.submit(request, detached=False)`` ties a job to
  the script instead: it is stopped when the script exits (or its client shuts down).
* On the **local** backend, on **Monarch** (a job's processes are the script's children),
  and for **callable jobs on Ray** (Ray tasks, owned by the script's Ray driver), jobs run
  inside the script and end with it whatever ``detached`` says.
* **Actors end with their client** (the script's exit, or ``shutdown()``), unless
  created detached (``ActorConfig(lifetime="detached")``).

So that nothing is left running or ended silently, one exit hook (:func:`watch` registers a
client with it when the client first gets work) settles every live client: the client core
(:meth:`fray.core._client_core.ClientCore._settle_at_exit`) stops the attached jobs, and
prints one notice on stderr through :func:`report`, naming the jobs that keep
running (with the commands that list and stop them), the ones stopped because they were
attached, and the ones that end with the script. A backend only says where its jobs run
(its :class:`ExitNotice`) and whether a job outlives the script.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["ExitNotice", "Leftovers", "report", "settle_all", "watch", "watched"]

_SHOWN = 5  # ids named in a notice; the rest are counted


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_SHOWN])
    return shown + (f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else "")


def _jobs(count: int) -> str:
    return f"{count} job" + ("" if count == 1 else "s")


@dataclass(frozen=True)
class ExitNotice:
    """How one backend names itself and its commands in the exit notice."""

    where: str
    list_hint: str = ""
    stop_hint: str = ""
    why_ended: str = ""


@dataclass
class Leftovers:
    """What an exiting script leaves behind on one backend: job ids, by what becomes of them."""

    kept: list[str] = field(default_factory=list)
    """Jobs that keep running (they outlive the script and were not attached)."""
    stopped: list[str] = field(default_factory=list)
    """Jobs stopped now because they were submitted with ``detached=False``."""
    ended: list[str] = field(default_factory=list)
    """Jobs that end with the script, whatever ``detached`` says."""


def report(notice: ExitNotice, leftovers: Leftovers) -> None:
    """Print what the exiting script leaves behind where ``notice`` says (nothing when there is nothing to say)."""
    kept, stopped, ended = leftovers.kept, leftovers.stopped, leftovers.ended
    lines = []
    if kept:
        verb = "keeps" if len(kept) == 1 else "keep"
        lines.append(f"fray: {_jobs(len(kept))} of this script {verb} running on {notice.where}: {_ids(kept)}")
        if notice.list_hint or notice.stop_hint:
            lines.append("      " + "; ".join(part for part in (notice.list_hint, notice.stop_hint) if part))
    if stopped:
        lines.append(f"fray: stopped {_jobs(len(stopped))} submitted with detached=False: {_ids(stopped)}")
    if ended:
        reason = f" ({notice.why_ended})" if notice.why_ended else ""
        verb = "ends" if len(ended) == 1 else "end"
        lines.append(f"fray: {_jobs(len(ended))} {verb} with this script{reason}: {_ids(ended)}")
    if lines:
        try:
            sys.stderr.write("\n".join(lines) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr already closed at exit: nothing more to do
            pass


class _Settles(Protocol):
    def _settle_at_exit(self) -> None: ...


_clients: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def watch(client: _Settles) -> None:
    """Settle ``client`` when the interpreter exits (called when it first gets work; cheap after that).

    The hook is registered again each time a client is added, so that it runs before the
    exit hooks of engines imported since (``atexit`` runs in reverse order), while jobs can
    still be asked and stopped.
    """
    if client in _clients:
        return
    with _lock:
        _clients.add(client)
        atexit.unregister(settle_all)
        atexit.register(settle_all)


def hand_over(client: _Settles) -> None:
    """Settle nothing for ``client`` at exit: its jobs were handed to the cluster on purpose, and it says so itself.

    For a command whose whole point is to leave a job running (``fray job submit``): the
    notice would tell the user what they just asked for.
    """
    with _lock:
        _clients.discard(client)


def watched() -> list[Any]:
    """The clients that have had work and are not settled yet (what :mod:`fray.testing`'s plugin asks for stacks)."""
    with _lock:
        return list(_clients)


def settle_all() -> None:
    """What runs at exit: every watched client applies the rule and prints its notice."""
    for client in list(_clients):
        with contextlib.suppress(Exception):  # best effort: one engine half gone at exit spoils no other notice
            client._settle_at_exit()
