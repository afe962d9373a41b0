"""marin's ``fray.types``: the values of a job, under the module path marin's code imports.

Every name here *is* Fray's own type or function (``fray.types.ResourceConfig is
fray.ResourceConfig``); marin's extra fields and methods live on those types. See
``docs/marin.md`` for each name and what still differs.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from fray.actor_config import ActorConfig
from fray.job import (
    BinaryEntrypoint,
    CallableEntrypoint,
    Duration,
    Entrypoint,
    EnvironmentConfig,
    JobRequest,
    JobStatus,
    SecretBehavior,
    create_environment,
)
from fray.resources import (
    ANY_REGION,
    DEFAULT_TPU_HOST_FRACTION,
    TPU_HBM_BYTES_PER_CHIP,
    TPU_HOST_RESOURCES,
    CpuConfig,
    DeviceConfig,
    GpuConfig,
    ResourceConfig,
    TpuConfig,
    TpuFamily,
    TpuHostResources,
    get_tpu_topology,
    tpu_family,
    tpu_hbm_bytes_per_chip,
    tpu_hbm_capacity_bytes,
)
from fray.resources import TPU_TOPOLOGIES as _TOPOLOGIES
from fray.resources import TpuTopology as TpuTopologyInfo

#: marin's list of the known TPU slices (``fray.TPU_TOPOLOGIES`` is the same facts as a dict by name).
TPU_TOPOLOGIES: list[TpuTopologyInfo] = list(_TOPOLOGIES.values())

#: marin's annotation for a device kind.
DeviceKind: TypeAlias = Literal["cpu", "gpu", "tpu"]
#: marin's annotation for a GPU type: a name such as ``"H100"`` (Fray checks it against ``fray.GPU_TYPES``).
GpuType: TypeAlias = str
#: marin's annotation for a TPU type: a slice name such as ``"v5p-8"`` (checked against ``fray.TPU_TOPOLOGIES``).
TpuType: TypeAlias = str

__all__ = [
    "ANY_REGION",
    "DEFAULT_TPU_HOST_FRACTION",
    "TPU_HBM_BYTES_PER_CHIP",
    "TPU_HOST_RESOURCES",
    "TPU_TOPOLOGIES",
    "ActorConfig",
    "BinaryEntrypoint",
    "CallableEntrypoint",
    "CpuConfig",
    "DeviceConfig",
    "DeviceKind",
    "Duration",
    "Entrypoint",
    "EnvironmentConfig",
    "GpuConfig",
    "GpuType",
    "JobRequest",
    "JobStatus",
    "ResourceConfig",
    "SecretBehavior",
    "TpuConfig",
    "TpuFamily",
    "TpuHostResources",
    "TpuTopologyInfo",
    "TpuType",
    "create_environment",
    "get_tpu_topology",
    "tpu_family",
    "tpu_hbm_bytes_per_chip",
    "tpu_hbm_capacity_bytes",
]
