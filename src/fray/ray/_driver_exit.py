"""The driver-exit rule on Ray (:mod:`fray._driver_exit`): which of a script's jobs end with it.

Callable jobs are Ray tasks owned by the script's Ray driver: Ray ends them when the
driver exits. Binary jobs go through Ray's job API and outlive the driver, unless
submitted with ``detached=False``: those are stopped here at exit. :func:`track` is
called once per submitted job; the exit hook is registered at the first call, after
Ray itself is imported, so that it runs before Ray's own shutdown hook.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from typing import Any

from fray._driver_exit import report_leftovers

__all__ = ["track"]

# job handle -> (namespace, detached, outlives the driver)
_tracked: weakref.WeakKeyDictionary[Any, tuple[str, bool, bool]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_registered = False


def track(job: Any, namespace: str, *, detached: bool, outlives_driver: bool) -> None:
    """Remember ``job`` (a Ray job handle) for the exit rule."""
    global _registered
    with _lock:
        _tracked[job] = (namespace, detached, outlives_driver)
        if not _registered:
            atexit.register(_at_exit)
            _registered = True


def _at_exit() -> None:
    with _lock:
        tracked = list(_tracked.items())
    kept, stopped, ended = [], [], []
    for job, (_, detached, outlives) in tracked:
        if job.status().finished:
            continue
        if not outlives:
            ended.append(job.job_id)
        elif detached:
            kept.append(job.job_id)
        else:
            with contextlib.suppress(Exception):  # Ray may be half gone at exit: best effort
                job.terminate()
            stopped.append(job.job_id)
    report_leftovers(
        "Ray",
        kept=kept,
        stopped=stopped,
        ended=ended,
        list_hint="list them: ray job list",
        stop_hint="stop one: ray job stop fray-<job id>-a<attempt>-r<replica>",
        why_ended="callable jobs are Ray tasks of this script's driver",
    )
