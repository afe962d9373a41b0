"""What a task process is started with: its environment, and the NUL bytes that would keep it from starting.

The worker (:mod:`fray.cluster.server.worker`) builds each task's environment here before it prepares
the job's environment (:mod:`fray.cluster.server.envs._environments`) and starts the process.
"""

from __future__ import annotations

import os

from fray.cluster.protocol.messages import TaskAssignment
from fray.job import JobInfo
from fray.job_info import replica_env
from fray.process._ranks import RANK_VARS

__all__ = ["nul_problem", "task_env"]

# The worker's own secrets, which its tasks must not inherit; nor a rank the worker's process may have.
_NOT_INHERITED = frozenset({"FRAY_TOKEN", "FRAY_CREDENTIAL", *RANK_VARS})


def task_env(assignment: TaskAssignment, worker_id: str, controller: str) -> dict[str, str]:
    """The environment of ``assignment``'s process on worker ``worker_id`` of the controller at ``controller``."""
    key, spec = assignment.key, assignment.spec
    info = JobInfo(
        key.job_id,
        assignment.job_name,
        assignment.replica_index,
        assignment.replica_count,
        assignment.namespace,
        key.attempt,
        priority_band=spec.priority,
    )
    # The worker's own variables (never its credential, nor a cluster token), then Fray's
    # for this task -- the job's own credential and its namespace's actor key -- then the
    # user's (which win).
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    env.update(
        FRAY_TASK_INDEX=str(key.task_index),
        FRAY_HOST_INDEX=str(assignment.host_index),
        FRAY_WORKER_ID=worker_id,
    )
    env.update(assignment.device_env)
    if assignment.credential:
        env["FRAY_CREDENTIAL"] = assignment.credential
    if assignment.actor_token:
        env["FRAY_TOKEN"] = assignment.actor_token
    env.update(replica_env(info, f"fray://{controller}", spec.environment.env_vars))
    return env


def nul_problem(argv: list[str], env: dict[str, str]) -> str:
    """Why the task cannot be started because of a NUL byte, or ""."""
    for i, arg in enumerate(argv):
        if "\0" in arg:
            return f"argument {i} of the command contains a NUL byte, which no program can receive"
    for key, value in env.items():
        if "\0" in key or "\0" in value:
            return f"environment variable {key!r} contains a NUL byte"
    return ""
