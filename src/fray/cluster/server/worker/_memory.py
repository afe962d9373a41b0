"""The worker's memory watchdog: a job's ``ram`` is its limit, not only a reservation.

One thread per worker (:class:`MemoryWatch`) reads, every :data:`SAMPLE_SECONDS`, the resident
memory (RSS) of every process of each task's process group from ``/proc`` (one pass over
``/proc/*/stat``, a few milliseconds; nothing is read while the worker runs no task), and keeps
each task's peak. A task whose group holds more than its job's ``ram`` plus the slack
(:func:`kill_threshold`: 10 % and 16 MiB, room for the interpreter's own jitter) is sent
SIGKILL, and its failure says ``out of memory`` with the limit and the peak (see
:func:`fray.core._death.describe_exit`): a *failure* of the job, charged to
``max_retries_failure`` (the same job would only run out again), never a preemption.

Limits of what is measured, said plainly: the sum of the group's RSS counts pages a forked
process shares with its parent once per process, so a task that forks many workers from a
large parent is charged more than it holds; a process that leaves the task's group (a
``setsid`` daemon) or runs in a container is not counted; a spike shorter than a sample can
pass unseen (the kernel's OOM killer still guards the machine, and its SIGKILL is worded as
such). The default ``ram`` (``ResourceConfig``'s ``128m``, given to every job that names
none) and ``ram=0`` are reservations only: enforcing a size the user never chose would kill
jobs that merely import a large library.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from fray.cluster.protocol.capacity import TaskResources

__all__ = ["SAMPLE_SECONDS", "MemoryWatch", "Watched", "group_rss", "kill_threshold", "memory_limit"]

logger = logging.getLogger(__name__)

#: How often the watchdog samples its tasks' memory.
SAMPLE_SECONDS = 0.25
_SLACK_FRACTION = 0.10
_SLACK_BYTES = 16 << 20
_DEFAULT_RAM = TaskResources().ram_bytes
try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
except (ValueError, OSError):  # no sysconf here: the common page size
    _PAGE = 4096


def memory_limit(ram_bytes: int) -> int:
    """A job's ``ram`` as its tasks' memory limit in bytes; 0 (none) for ``ram=0`` and the default size."""
    return 0 if ram_bytes in (0, _DEFAULT_RAM) else ram_bytes


def kill_threshold(limit: int) -> int:
    """The resident bytes past which a task limited to ``limit`` is killed: the limit plus 10 % and 16 MiB."""
    return limit + int(limit * _SLACK_FRACTION) + _SLACK_BYTES


def group_rss(groups: Iterable[int]) -> dict[int, int]:
    """Bytes resident in each of the process ``groups`` (by group id), from ``/proc/*/stat``; {} without ``/proc``."""
    totals = dict.fromkeys(groups, 0)
    if not totals:
        return totals
    try:
        entries = os.scandir("/proc")
    except OSError:
        return {}
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    data = stat.read()
                # After the command's closing parenthesis: state, ppid, pgrp (index 2) ... rss in pages (index 21).
                fields = data[data.rindex(b")") + 2 :].split()
                group = int(fields[2])
                if group in totals:
                    totals[group] += int(fields[21]) * _PAGE
            except (OSError, ValueError, IndexError):  # it exited between the listing and the read
                continue
    return totals


class Watched(Protocol):
    """What the watchdog reads and marks of a task (a worker's ``TaskProcess``)."""

    proc: Any  # a Popen or a ForkedProcess: pid and poll()
    killed: bool
    peak_rss: int
    oom_used: int

    @property
    def assignment(self) -> Any: ...

    @property
    def memory_limit(self) -> int: ...


class MemoryWatch:
    """The watchdog thread: samples the tasks ``tasks()`` returns until ``stopping`` is set (see the module)."""

    def __init__(self, tasks: Callable[[], Iterable[Watched]], stopping: threading.Event) -> None:
        self._tasks = tasks
        self._stopping = stopping

    def start(self) -> threading.Thread:
        """Run the watchdog in a daemon thread (returned)."""
        thread = threading.Thread(target=self._loop, name="fray-worker-memory", daemon=True)
        thread.start()
        return thread

    def _loop(self) -> None:
        while not self._stopping.wait(SAMPLE_SECONDS):
            try:
                self.sample()
            except Exception:  # never dies: a task's memory is measured again on the next pass
                logger.exception("sampling the tasks' memory failed")

    def sample(self) -> None:
        """One pass: record each running task's resident memory and peak; kill those past their limit."""
        running = [task for task in self._tasks() if task.proc is not None and task.proc.poll() is None]
        if not running:
            return
        totals = group_rss(task.proc.pid for task in running if task.proc is not None)
        for task in running:
            assert task.proc is not None
            used = totals.get(task.proc.pid, 0)
            task.peak_rss = max(task.peak_rss, used)
            limit = task.memory_limit
            if limit and used > kill_threshold(limit) and not task.oom_used and not task.killed:
                task.oom_used = used  # first: the task's exit is read as this kill, never as a plain SIGKILL
                logger.warning(
                    "task %s holds %d bytes, past its limit ram=%d: killing it", task.assignment.key, used, limit
                )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(task.proc.pid, signal.SIGKILL)
