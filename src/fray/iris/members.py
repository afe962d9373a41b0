"""The "job" of one actor-group member on Iris: one task of the group's Iris job.

An actor group is one Iris job with a task per member (``fray.iris.group``), but Fray's
:class:`~fray.actor.ActorGroup` hands out a job per member (``group.jobs``), whose status,
wait, failure and logs are that member's alone. :class:`IrisMemberJob` is that view: its id
is the member's endpoint name, ``{group job id}/{group name}-{index}``; its status is its task's
state (:data:`~fray.iris.mapping.TASK_STATES`); its failure is read from its task's last
attempt, as a job's is.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from iris.cluster.types import JobName, TaskAttempt

from fray.core._lifecycle import Failure
from fray.iris._stacks import ask_tasks, task_target
from fray.iris.job import (
    FAILED_TASK,
    POLL_INTERVAL,
    IrisJobHandle,
    iris_errors,
    mark_terminated,
    read_logs,
    task_failure,
    terminated_here,
)
from fray.iris.mapping import member_status
from fray.job import JobHandleBase, JobStatus, JobSummary, timeout_error
from fray.stacks import ProcessStacks

if TYPE_CHECKING:
    from iris.client.workload import TaskStatus

__all__ = ["IrisMemberJob"]


class IrisMemberJob(JobHandleBase):
    """Member ``index`` of an actor group, as a job: task ``index * hosts`` of the group's Iris job.

    Terminating it stops that member alone: a group of one is its job, cancelled; in a larger
    group Iris fails the member's task (Iris has no cancel for one task), and the member reads
    STOPPED since this process stopped it.
    """

    def __init__(self, group_job: IrisJobHandle, index: int, member_id: str, count: int, hosts: int = 1) -> None:
        self._group_job = group_job
        self._index = index
        self._member_id = member_id
        self._count = count
        self._hosts = hosts
        self._lock = threading.Lock()
        self._final: JobStatus | None = None
        self._failure: Failure | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (IrisMemberJob, (self._group_job, self._index, self._member_id, self._count, self._hosts))

    def __repr__(self) -> str:
        return f"IrisMemberJob({self._member_id!r})"

    @property
    def job_id(self) -> str:
        """The member's id: its endpoint name, ``{group job id}/{group name}-{index}``."""
        return self._member_id

    @property
    def group_job(self) -> IrisJobHandle:
        """The Iris job of the whole group."""
        return self._group_job

    def _task_name(self) -> JobName:
        return JobName.from_wire(self._group_job.job_id).task(self._index * self._hosts)

    def _task(self) -> TaskStatus:
        with iris_errors(self._member_id):
            return self._group_job._iris().task_status(self._task_name())

    def _terminated_here(self) -> bool:
        return terminated_here(self._member_id) or self._group_job._terminated_here()

    def _known_finished(self) -> bool:
        return self._final is not None

    def _status_of(self, task: TaskStatus) -> JobStatus:
        status = member_status(task.state)
        if status.finished and status != JobStatus.SUCCEEDED and self._terminated_here():
            status = JobStatus.STOPPED  # this process stopped it (a failed task, in a larger group)
        if status.finished:
            self._final = status
        return status

    def status(self) -> JobStatus:
        """The member's status: its task's state (one query to the controller)."""
        if self._final is not None:
            return self._final
        return self._status_of(self._task())

    def info(self) -> JobSummary:
        """The member's status and, while it is PENDING, Iris's reason."""
        if self._final is not None:
            return JobSummary(self._member_id, self._final)
        task = self._task()
        status = self._status_of(task)
        return JobSummary(self._member_id, status, task.pending_reason if status == JobStatus.PENDING else "")

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the member's task finished; raise its failure (JobFailed) if it failed, unless told not to."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while not (status := self.status()).finished:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise timeout_error(self.info(), timeout)
            time.sleep(delay if remaining is None else min(delay, remaining))
            delay = min(delay * 1.5, POLL_INTERVAL)
        if status == JobStatus.FAILED and raise_on_failure:
            raise self.failure().error(self._member_id)
        return status

    def terminate(self) -> None:
        """Stop this member (see the class docstring); a no-op once it finished."""
        if self._final is not None:
            return
        mark_terminated(self._member_id)
        if self._count == 1:
            self._group_job.terminate()
            return
        if not self.status().finished:
            with iris_errors(self._member_id):
                iris = self._group_job._iris()
                iris.fail_tasks([TaskAttempt(self._task_name())], reason="terminated by its Fray client")

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The member's process's stacks, asked in its task's container through Iris (``fray.iris._stacks``)."""
        task = self._task()
        if self._status_of(task).finished:
            return ()
        return ask_tasks(self._group_job._iris(), [task_target(task, f"member {self._index}")], timeout, locals)

    def logs(self, max_lines: int | None = None) -> tuple[str, ...]:
        """The last ``max_lines`` lines the member's task wrote (all for None or 0)."""
        with iris_errors(self._member_id):
            return read_logs(self._group_job._iris().task(self._task_name()), max_lines)

    def failure(self) -> Failure:
        """Why the (FAILED) member failed: its task's last attempt, read once."""
        with self._lock:
            if self._failure is None:
                task = self._task()
                meta = self._group_job.meta
                if task.state in FAILED_TASK and task.attempts:
                    with iris_errors(self._member_id):
                        self._failure = task_failure(self._group_job._iris(), task, meta)
                else:
                    reason = task.error_message or task.pending_reason or f"Iris task state {task.state}"
                    self._failure = Failure(f"Iris could not run the member: {reason}")
            return self._failure
