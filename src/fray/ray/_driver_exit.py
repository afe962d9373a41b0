"""The driver-exit rule on Ray (:mod:`fray.core._driver_exit`): which of a script's jobs end with it.

Callable jobs are Ray tasks owned by the script's Ray driver: Ray ends them when the
driver exits. Binary jobs go through Ray's job API and outlive the driver, unless
submitted with ``detached=False``: those are stopped at exit by the shared
:class:`~fray.core._driver_exit.JobsAtExit`, whose hook is registered at the first job,
after Ray itself is imported, so that it runs before Ray's own shutdown hook.
"""

from __future__ import annotations

from typing import Any

from fray.core._driver_exit import ExitNotice, JobsAtExit

__all__ = ["NOTICE", "RULE", "track"]

NOTICE = ExitNotice(
    "Ray",
    list_hint="list them: ray job list",
    stop_hint="stop one: ray job stop fray-<job id>-a<attempt>-r<replica>",
    why_ended="callable jobs are Ray tasks of this script's driver",
)
RULE = JobsAtExit()


def track(job: Any, *, detached: bool, outlives_driver: bool) -> None:
    """Remember ``job`` (a Ray job handle) for the exit rule."""
    RULE.track(job, NOTICE, detached=detached, outlives_driver=outlives_driver)
