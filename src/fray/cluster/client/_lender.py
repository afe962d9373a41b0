"""A task of a Fray cluster lends its CPU to the controller while it blocks on its own work.

Installed once per task process by the first :class:`~fray.cluster.client.ClusterClient` made
inside it (:func:`lend_through`); :mod:`fray.core._lending` calls it. The messages go out in
order on one background thread, so neither a blocked wait nor a resuming one waits for the
controller: a lost message costs only a late or missing lend, never a wrong state for long --
the controller forgets lent tasks when they end.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

from fray.cluster.protocol.controller_client import ControllerProxy
from fray.cluster.protocol.records import TaskKey
from fray.core._lending import lend_for_this_process, process_lender

__all__ = ["lend_through"]


class _TaskLender:
    """Tells the controller that task ``key`` lent its CPU, or took it back."""

    def __init__(self, controller: ControllerProxy, key: TaskKey) -> None:
        self._controller = controller
        self._key = key
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fray-lend")

    def lend(self) -> None:
        self._sender.submit(self._send, True)

    def reclaim(self) -> None:
        self._sender.submit(self._send, False)

    def _send(self, lent: bool) -> None:
        with contextlib.suppress(Exception):  # best effort: the task goes on whatever the controller heard
            self._controller.lend_cpu(self._key, lent)


def lend_through(controller: ControllerProxy) -> None:
    """In a task process of the cluster, lend its CPU through ``controller`` while it blocks (once per process)."""
    job_id, task, attempt = (os.environ.get(name, "") for name in ("FRAY_JOB_ID", "FRAY_TASK_INDEX", "FRAY_ATTEMPT"))
    if process_lender() is None and job_id and task.isdigit() and attempt.isdigit():
        lend_for_this_process(_TaskLender(controller, TaskKey(job_id, int(task), int(attempt))))
