"""What the controller builds from its records for others: a job's :class:`JobView`, a TPU task's environment.

:class:`~fray.cluster.server.controller.ControllerService` answers clients with :func:`job_view` and
gives each TPU task's assignment the environment of :func:`tpu_device_env`.
"""

from __future__ import annotations

from collections.abc import Mapping

from fray.cluster.protocol.messages import JobView
from fray.cluster.protocol.records import JobRecord, TaskRecord
from fray.cluster.server.store import ClusterStore
from fray.cluster.server.store._views import behind_note
from fray.core.inside._tpu_env import tpu_host_env

__all__ = ["job_view", "tpu_device_env"]


def job_view(job: JobRecord, failure: bytes | None, settled: bool, waiting: Mapping[int, int] | None = None) -> JobView:
    """What clients see of ``job``: its record, ``failure`` (of a FAILED job) and whether it is ``settled``.

    ``waiting`` (pending jobs per band), when given, lets a pending job's reason name the
    better-band jobs it waits behind (see ``docs/scheduler.md``, "Priority bands").
    """
    return JobView(
        job_id=job.job_id,
        name=job.name,
        namespace=job.namespace,
        state=job.state,
        attempt=job.attempt,
        pending_reason=job.pending_reason + behind_note(job, waiting or {}),
        error=job.error,
        failure=failure,
        settled=settled,
        parent_id=job.parent_id,
        user=job.user,
        submitted_at=job.submitted_at,
        finished_at=job.finished_at,
        replicas=job.replicas,
        band=job.band,
    )


def tpu_device_env(store: ClusterStore, job: JobRecord, task: TaskRecord) -> dict[str, str]:
    """For a TPU task: its slice, host index and (multislice) the coordinator, host 0 of slice 0."""
    topology = job.resources.tpu
    if topology is None or task.worker_id is None:
        return {}
    slice_name = store.get_worker(task.worker_id).info.tpu_name or task.worker_id
    # The gang is placed as a unit, so host 0 of slice 0 has its worker by now.
    first = next((t for t in store.get_tasks(task.job_id, task.attempt) if t.task_index == 0), None)
    coordinator = store.get_worker(first.worker_id).address if first and first.worker_id else ""
    return tpu_host_env(
        slice_name,
        task.host_index,
        topology.hosts,
        slice_id=task.replica_index,
        num_slices=job.replicas,
        coordinator_ip=coordinator.rsplit(":", 1)[0],  # a worker's address is HOST:PID
    )
