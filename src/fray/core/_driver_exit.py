"""What happens to a script's jobs and actors when it exits: one rule for every backend, and the notice it prints.

The rule (also in the README and ``docs/architecture.md``):

* **Jobs outlive the script** that submitted them, wherever the backend runs them
  outside the script: on a Fray cluster (``fray://``) every job, on Ray the binary
  jobs (Ray's job API). ``client.submit(request, detached=False)`` ties a job to the
  script instead: it is stopped when the script exits (or its client shuts down).
* On the **local** backend, and for **callable jobs on Ray** (Ray tasks, owned by the
  script's Ray driver), jobs run inside the script and end with it whatever
  ``detached`` says.
* **Actors end with their client** (the script's exit, or ``shutdown()``), unless
  created detached (``ActorConfig(lifetime="detached")``).

So that nothing is left running or ended silently, each backend calls
:func:`report_leftovers` at interpreter exit, which prints one notice on stderr
naming the jobs that keep running (and the commands that list and stop them), the
ones stopped because they were attached, and the ones that end with the script.
Backends whose client holds a handle per job (Ray, Monarch, Iris) apply the rule
through one :class:`JobsAtExit`; the local backend and the Fray cluster, which know
their jobs in bulk, call :func:`report_leftovers` themselves.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["ExitNotice", "JobsAtExit", "report_leftovers"]

_SHOWN = 5  # ids named in a notice; the rest are counted


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_SHOWN])
    return shown + (f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else "")


def _jobs(count: int) -> str:
    return f"{count} job" + ("" if count == 1 else "s")


def report_leftovers(
    where: str,
    *,
    kept: Sequence[str] = (),
    stopped: Sequence[str] = (),
    ended: Sequence[str] = (),
    list_hint: str = "",
    stop_hint: str = "",
    why_ended: str = "",
) -> None:
    """Print what the exiting script leaves behind on ``where`` (nothing when there is nothing to say)."""
    lines = []
    if kept:
        verb = "keeps" if len(kept) == 1 else "keep"
        lines.append(f"fray: {_jobs(len(kept))} of this script {verb} running on {where}: {_ids(kept)}")
        if list_hint or stop_hint:
            lines.append("      " + "; ".join(part for part in (list_hint, stop_hint) if part))
    if stopped:
        lines.append(f"fray: stopped {_jobs(len(stopped))} submitted with detached=False: {_ids(stopped)}")
    if ended:
        reason = f" ({why_ended})" if why_ended else ""
        verb = "ends" if len(ended) == 1 else "end"
        lines.append(f"fray: {_jobs(len(ended))} {verb} with this script{reason}: {_ids(ended)}")
    if lines:
        try:
            sys.stderr.write("\n".join(lines) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr already closed at exit: nothing more to do
            pass


@dataclass(frozen=True)
class ExitNotice:
    """How one backend names itself and its commands in the exit notice."""

    where: str
    list_hint: str = ""
    stop_hint: str = ""
    why_ended: str = ""


class _Job(Protocol):
    @property
    def job_id(self) -> str: ...

    def status(self) -> Any: ...

    def terminate(self) -> None: ...


class JobsAtExit:
    """The driver-exit rule for jobs submitted through handles: track each; at exit, stop the attached ones, report.

    A job that ``outlives_driver`` keeps running unless it was submitted with
    ``detached=False`` (then it is terminated); one that does not ends with the script
    whatever ``detached`` says, and is named as such. The exit hook is registered at the
    first :meth:`track`, i.e. after the engine was imported, so that it runs before the
    engine's own exit hooks (``atexit`` runs in reverse order) while jobs can still be
    asked and stopped.
    """

    def __init__(self) -> None:
        self._jobs: weakref.WeakKeyDictionary[Any, tuple[ExitNotice, bool, bool]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._registered = False

    def track(self, job: _Job, notice: ExitNotice, *, detached: bool, outlives_driver: bool) -> None:
        """Remember ``job`` for the rule; ``notice`` says where it runs."""
        with self._lock:
            self._jobs[job] = (notice, detached, outlives_driver)
            if not self._registered:
                atexit.register(self.settle)
                self._registered = True

    def settle(self) -> None:
        """Apply the rule now (what runs at exit): stop attached jobs, print one notice per place."""
        with self._lock:
            tracked = list(self._jobs.items())
        outcome: dict[ExitNotice, tuple[list[str], list[str], list[str]]] = {}
        for job, (notice, detached, outlives) in tracked:
            with contextlib.suppress(Exception):  # the engine may be half gone at exit: best effort
                if job.status().finished:
                    continue
            kept, stopped, ended = outcome.setdefault(notice, ([], [], []))
            if not outlives:
                ended.append(job.job_id)
            elif detached:
                kept.append(job.job_id)
            else:
                with contextlib.suppress(Exception):
                    job.terminate()
                stopped.append(job.job_id)
        for notice, (kept, stopped, ended) in outcome.items():
            report_leftovers(
                notice.where,
                kept=kept,
                stopped=stopped,
                ended=ended,
                list_hint=notice.list_hint,
                stop_hint=notice.stop_hint,
                why_ended=notice.why_ended,
            )
