"""What a :class:`~fray.cluster.server.worker.Worker` keeps about its tasks: each one's process, and unsent reports.

Plain records, touched under the worker's lock. A task's exit is not here: it goes into
the worker's durable :class:`~fray.cluster.server.worker._journal.OutcomeJournal`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from fray.cluster.protocol.messages import TaskAssignment
from fray.cluster.protocol.records import TaskKey
from fray.cluster.server.taskproc._launch import ForkedProcess
from fray.cluster.server.worker._memory import memory_limit
from fray.core._death import describe_exit
from fray.core._lifecycle import Failure, FailureKind

__all__ = ["PendingReports", "Process", "TaskProcess"]

Process = subprocess.Popen[bytes] | ForkedProcess


@dataclass
class TaskProcess:
    """One task on this worker: its assignment, its process (None until started), where it writes why it failed."""

    assignment: TaskAssignment
    proc: Process | None
    failure_path: Path
    killed: bool = False
    #: Stopped by the worker's drain: handed back to the controller (preempted) whatever its exit status.
    handed_back: bool = False
    #: The most memory its process group was seen holding (bytes resident; 0: never sampled).
    peak_rss: int = 0
    #: What its process group held when the worker's memory limit killed it (0: the limit did not).
    oom_used: int = 0

    @property
    def memory_limit(self) -> int:
        """The job's ``ram`` as this task's memory limit in bytes; 0: none (see :mod:`._memory`)."""
        return memory_limit(self.assignment.spec.resources.ram_bytes)

    def failure(self, code: int, last_output: list[str]) -> bytes:
        """Why the task failed, encoded: what its Python code raised, else how it died, with its last output."""
        spec = self.assignment.spec
        command = spec.argv[0] if spec.argv else self.assignment.job_name
        peak = self.peak_rss or None
        if self.oom_used:  # the worker's memory limit killed it: say so, whatever the process wrote
            limit, used = self.memory_limit, self.oom_used
            return Failure.from_exit(command, code, last_output, oom_limit=limit, used=used, peak_rss=peak).encode()
        try:
            written = self.failure_path.read_bytes()  # written by fray.process._jobmain
        except OSError:
            return Failure.from_exit(command, code, last_output, peak_rss=peak).encode()
        try:
            failure = Failure.decode(written)
        except (ValueError, KeyError):  # not one _jobmain wrote whole: pass it on as it is
            return written
        if failure.kind == FailureKind.PREEMPTION:
            # Written ahead by the process (fray.process._jobmain.if_killed: an actor's host) for a death it
            # could not explain itself: the exit says what it was.
            how = describe_exit(code, peak_rss=peak, stderr_tail=last_output)
            failure = failure.with_message(f"{failure.message}: {how}")
        return failure.with_last_lines(last_output, peak).encode()


@dataclass
class PendingReports:
    """Starts and log lines not yet delivered (exits live in the journal)."""

    started: list[TaskKey] = field(default_factory=list)
    logs: dict[TaskKey, list[str]] = field(default_factory=dict)

    def take(self) -> tuple[list[TaskKey], list[tuple[TaskKey, list[str]]]]:
        """Everything pending, for one report; it is pending no more (see :meth:`put_back`)."""
        started, logs = list(self.started), list(self.logs.items())
        self.started.clear()
        self.logs.clear()
        return started, logs

    def put_back(self, started: list[TaskKey], logs: list[tuple[TaskKey, list[str]]]) -> None:
        """Return what :meth:`take` gave to a report that was not delivered, ahead of what came since."""
        self.started[:0] = started
        for key, lines in logs:
            self.logs.setdefault(key, [])[:0] = lines
