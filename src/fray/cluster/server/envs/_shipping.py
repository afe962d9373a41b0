"""What a client does at submit for a job's environment on a Fray cluster (see :mod:`fray.cluster.server.envs._environments`).

* ``workspace``: packed (:mod:`fray.cluster.server.envs._workspace`), uploaded to the controller
  unless it already holds those bytes, and named in the spec by its digest;
* ``docker_image``: refused now, with the reason, when no worker of the cluster has a
  container runtime (workers advertise one as the attribute ``container-runtime``);
* ``extras``: names of extras or dependency groups of the workspace's project, checked now
  against its ``pyproject.toml`` (:mod:`fray.cluster.server.envs._project`); extras without a
  workspace are refused. The worker installs what they bring.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fray.cluster.protocol.controller_client import CredentialLike, ops_client
from fray.cluster.protocol.messages import JobSpec
from fray.cluster.server.envs._project import read_project, requirements_of
from fray.cluster.server.envs._workspace import digest_of, pack_workspace
from fray.errors import ConfigError

__all__ = ["CONTAINER_RUNTIME_ATTRIBUTE", "ship_environment"]

#: The worker attribute that says which container runtime it has (``docker`` or ``podman``).
CONTAINER_RUNTIME_ATTRIBUTE = "container-runtime"


def _check_container_runtime(spec: JobSpec, controller: Any) -> None:
    workers = [w for w in controller.list_workers() if w.info.alive]
    if any(w.info.attributes.get(CONTAINER_RUNTIME_ATTRIBUTE) for w in workers):
        return
    raise ConfigError(
        f"job {spec.name!r}: docker_image={spec.environment.docker_image!r} needs a worker with a container runtime, "
        f"and none of this cluster's {len(workers)} workers has one (a worker started where `docker info` or "
        f"`podman info` works advertises {CONTAINER_RUNTIME_ATTRIBUTE}=...); drop docker_image to run in the "
        "workers' own environment"
    )


def ship_environment(spec: JobSpec, address: str, token: CredentialLike, controller: Any) -> JobSpec:
    """Check ``spec``'s environment against the cluster and upload its workspace; return the spec to submit."""
    environment = spec.environment
    if environment.docker_image:
        _check_container_runtime(spec, controller)
    if environment.extras and not environment.workspace:
        raise ConfigError(
            f"job {spec.name!r}: EnvironmentConfig(extras={list(environment.extras)!r}) names extras of the job's "
            "project, and the job ships none: set EnvironmentConfig(workspace=...) to the project's directory (the "
            "one with its pyproject.toml); the workers install what those extras bring"
        )
    if not environment.workspace:
        return spec
    data = pack_workspace(environment.workspace, spec.name)
    if environment.extras:  # a name the project lacks is refused now, not when a worker starts the job
        requirements_of(read_project(environment.workspace, spec.name), environment.extras, spec.name)
    digest = digest_of(data)
    ops = ops_client(address, token)
    try:
        if not ops.has_blob(digest):
            ops.put_blob(digest, data)
    finally:
        ops.close()
    return dataclasses.replace(spec, workspace_digest=digest)
