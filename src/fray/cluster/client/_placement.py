"""What the client settles before a job reaches the controller: the one device among its alternatives.

A request may list device alternatives (``ResourceConfig(device_alternatives=...)``); the
controller schedules one shape, so the client picks the first alternative some alive
worker offers (capacity aside: the scheduler waits for room) and tells the job's replicas
which through ``FRAY_DEVICE``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from fray.cluster.protocol.capacity import WorkerInfo
from fray.errors import ConfigError
from fray.job import EnvironmentConfig, JobRequest
from fray.resources import DeviceConfig, GpuConfig, ResourceConfig, TpuConfig, device_name

__all__ = ["placed", "placed_request"]


def placed_request(request: JobRequest, workers: Callable[[], Sequence[WorkerInfo]]) -> JobRequest:
    """``request`` for one device among its alternatives, with ``FRAY_DEVICE`` in its environment."""
    resources, env = placed(request.resources, workers)
    environment = request.environment or EnvironmentConfig()
    env_vars = {**env, **environment.env_vars}
    return dataclasses.replace(
        request, resources=resources, environment=dataclasses.replace(environment, env_vars=env_vars)
    )


def placed(
    resources: ResourceConfig, workers: Callable[[], Sequence[WorkerInfo]]
) -> tuple[ResourceConfig, dict[str, str]]:
    """``resources`` for one device (the first alternative one of ``workers()`` has), and the env saying which.

    ``workers`` (the alive workers' descriptions) is called only when there are alternatives.
    """
    if resources.zone is not None:
        raise ConfigError(
            f"ResourceConfig(zone={resources.zone!r}) cannot be honoured by the Fray cluster yet (its scheduler "
            "places by region); drop zone and use regions, or use the Ray backend"
        )
    chosen = resources.device
    if resources.device_alternatives:
        alive = workers()
        chosen = next(
            (d for d in resources.device_choices if any(_worker_has(info, d) for info in alive)),
            resources.device_choices[0],
        )
        resources = resources.with_device(chosen)
    return resources, {"FRAY_DEVICE": device_name(chosen)}


def _worker_has(info: WorkerInfo, device: DeviceConfig) -> bool:
    """Whether a worker offers ``device`` at all (its capacity aside)."""
    if isinstance(device, GpuConfig):
        gpu = info.device("gpu")
        return gpu is not None and (device.type == "auto" or gpu.type == device.type) and gpu.count >= device.count
    if isinstance(device, TpuConfig):
        tpu = info.device("tpu")
        return tpu is not None and tpu.type == device.type
    return True
