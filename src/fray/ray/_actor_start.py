"""Starting one Fray actor as a named Ray actor: its options, its environment, the name clash."""

from __future__ import annotations

from typing import Any

from fray.core._client_core import ActorStart
from fray.errors import ConfigError, JobAlreadyExists
from fray.job import JobInfo
from fray.job_info import replica_env
from fray.ray._launch import Launcher
from fray.ray._shipping import Shipping
from fray.ray._values import shield_call
from fray.ray.actors import RayActorHandle
from fray.ray.inside._actor_host import GROUP_ENV, INDEX_ENV
from fray.ray.resources import ray_options
from fray.resources import ResourceConfig, TpuConfig, device_name

__all__ = ["start_actor"]


def start_actor(
    start: ActorStart, reserved: ResourceConfig, job_id: str, launcher: Launcher, shipping: Shipping, spec: str
) -> RayActorHandle:
    """Start ``start`` as a Ray actor named as the Fray actor in the launcher's namespace; its handle.

    Every :class:`~fray.actor_config.ActorConfig` field maps onto Ray's actor option of the
    same name (a detached lifetime onto Ray's); ``reserved`` has the one device chosen.
    """
    name, config, namespace = start.name, start.config, launcher.namespace
    if isinstance(reserved.device, TpuConfig):
        raise ConfigError(f"actor {name!r}: actors cannot take a TpuConfig on Ray; submit a TPU job instead")
    info = JobInfo(job_id, name, 0, 1, namespace, 0, device_name(reserved.device), priority_band=config.priority)
    env = replica_env(info, spec)
    if start.group is not None:
        env.update({GROUP_ENV: start.group[0], INDEX_ENV: str(start.group[1])})
    options: dict[str, Any] = ray_options(reserved, pin_resource=launcher.pin_resource())
    options.update(
        name=name,
        namespace=namespace,
        max_concurrency=config.max_concurrency,
        max_restarts=config.max_restarts,
        max_task_retries=config.max_task_retries,
    )
    if config.detached:
        options["lifetime"] = "detached"
    try:
        args, kwargs = shield_call(start.args, start.kwargs)
        ray_handle = shipping.actor_class(start.actor_class).options(**options).remote(env, *args, **kwargs)
    except ValueError as exc:
        if "already" in str(exc) or "taken" in str(exc):
            raise JobAlreadyExists(
                name,
                reason=f"an actor of this name is already alive in Ray namespace {namespace!r}; shut it down "
                "first or pick another name",
            ) from None
        raise
    return RayActorHandle(name, namespace, start.actor_class, ray_handle, job_id=job_id)
