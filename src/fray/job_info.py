"""Who the running code is (:func:`current_job`), and how that identity reaches a replica's process.

Backends that run jobs in threads set :data:`_current_job` in the job's context;
process-based backends pass the identity in environment variables (:func:`job_env`,
:func:`replica_env`), which :func:`current_job` reads back.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Mapping
from dataclasses import dataclass

from fray.priority import TOP_LEVEL_BAND, PriorityBand

__all__ = ["JobInfo", "current_job", "effective_band", "job_env", "replica_env"]


@dataclass(frozen=True)
class JobInfo:
    """Who the running code is: returned by :func:`current_job` inside a job or actor.

    A replica of a job with ``processes_per_task=N`` runs N processes; each has its rank:
    ``local_process_index`` (0..N-1) among its replica's, ``local_process_count`` (N), and
    across the job ``process_index`` (``replica_index * N + local_process_index``) and
    ``process_count`` (``replica_count * N``). Left out, they are those of a replica's only
    process: ``process_index == replica_index``, ``process_count == replica_count``.
    """

    job_id: str
    name: str
    replica_index: int = 0
    replica_count: int = 1
    namespace: str = ""
    attempt: int = 0
    device: str = ""  #: the device this replica got (``"cpu"``, ``"gpu:H100:8"``, ``"tpu:v6e-16"``), "" if unknown
    process_index: int = None  # type: ignore[assignment]  # None: from the replica and local index
    process_count: int = None  # type: ignore[assignment]  # None: replica_count * local_process_count
    local_process_index: int = 0
    local_process_count: int = 1
    priority_band: int = TOP_LEVEL_BAND  #: the job's :class:`PriorityBand` (1..3), what its own submits inherit

    def __post_init__(self) -> None:
        if self.process_index is None:
            index = self.replica_index * self.local_process_count + self.local_process_index
            object.__setattr__(self, "process_index", index)
        if self.process_count is None:
            object.__setattr__(self, "process_count", self.replica_count * self.local_process_count)


_current_job: contextvars.ContextVar[JobInfo | None] = contextvars.ContextVar("fray_current_job", default=None)


def current_job() -> JobInfo | None:
    """The job this code runs in, or None outside any job.

    Backends that run jobs in threads set it in the job's context; process-based
    backends pass it through the ``FRAY_JOB_ID``, ``FRAY_JOB_NAME``,
    ``FRAY_REPLICA_INDEX``, ``FRAY_REPLICA_COUNT``, ``FRAY_NAMESPACE`` and
    ``FRAY_ATTEMPT`` (and ``FRAY_PRIORITY_BAND``) environment variables, and a process of a multi-process replica
    (``JobRequest.processes_per_task``) its rank through ``FRAY_PROCESS_INDEX``,
    ``FRAY_PROCESS_COUNT``, ``FRAY_LOCAL_PROCESS_INDEX`` and ``FRAY_LOCAL_PROCESS_COUNT``.
    """
    from fray.core.inside._runtime import check_terminated

    check_terminated()
    info = _current_job.get()
    if info is not None:
        return info
    job_id = os.environ.get("FRAY_JOB_ID")
    if not job_id:
        return None

    def _env_int(name: str) -> int | None:
        value = os.environ.get(name)
        return int(value) if value else None

    return JobInfo(
        job_id=job_id,
        name=os.environ.get("FRAY_JOB_NAME", job_id.rsplit("/", 1)[-1]),
        replica_index=int(os.environ.get("FRAY_REPLICA_INDEX", "0")),
        replica_count=int(os.environ.get("FRAY_REPLICA_COUNT", "1")),
        namespace=os.environ.get("FRAY_NAMESPACE", ""),
        attempt=int(os.environ.get("FRAY_ATTEMPT", "0")),
        device=os.environ.get("FRAY_DEVICE", ""),
        process_index=_env_int("FRAY_PROCESS_INDEX"),  # type: ignore[arg-type]  # None: this replica's only
        process_count=_env_int("FRAY_PROCESS_COUNT"),  # type: ignore[arg-type]
        local_process_index=_env_int("FRAY_LOCAL_PROCESS_INDEX") or 0,
        local_process_count=_env_int("FRAY_LOCAL_PROCESS_COUNT") or 1,
        priority_band=_env_int("FRAY_PRIORITY_BAND") or TOP_LEVEL_BAND,
    )


def job_env(info: JobInfo) -> dict[str, str]:
    """The environment variables that carry ``info`` into a child process (see :func:`current_job`)."""
    return {
        "FRAY_JOB_ID": info.job_id,
        "FRAY_JOB_NAME": info.name,
        "FRAY_REPLICA_INDEX": str(info.replica_index),
        "FRAY_REPLICA_COUNT": str(info.replica_count),
        "FRAY_NAMESPACE": info.namespace,
        "FRAY_ATTEMPT": str(info.attempt),
        "FRAY_DEVICE": info.device,
        "FRAY_PRIORITY_BAND": str(int(info.priority_band)),
    }


def replica_env(info: JobInfo, client_spec: str, user_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment one replica of a job runs with, on every process-based backend.

    Fray's identity variables (:func:`job_env`), ``FRAY_CLIENT_SPEC`` naming the backend
    (so ``current_client()`` inside the job reaches the same cluster), unbuffered Python
    output (so logs arrive as they are written), then the user's own variables, which win.
    """
    env = {**job_env(info), "FRAY_CLIENT_SPEC": client_spec, "PYTHONUNBUFFERED": "1"}
    if user_env:
        env.update(user_env)
    return env


def effective_band(priority: int) -> PriorityBand:
    """The band ``priority`` means here: itself, or for 0 the calling job's band (top level: interactive)."""
    if priority:
        return PriorityBand(priority)
    parent = current_job()
    return PriorityBand(parent.priority_band) if parent is not None else TOP_LEVEL_BAND
