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
    Entrypoint,
    EnvironmentConfig,
    JobRequest,
    JobStatus,
    create_environment,
)
from fray.resources import (
    ANY_REGION,
    TPU_HBM_BYTES_PER_CHIP,
    CpuConfig,
    DeviceConfig,
    GpuConfig,
    ResourceConfig,
    TpuConfig,
    get_tpu_topology,
    tpu_family,
    tpu_hbm_bytes_per_chip,
    tpu_hbm_capacity_bytes,
)
from fray.resources import TpuTopology as TpuTopologyInfo

#: marin's annotation for a device kind.
DeviceKind: TypeAlias = Literal["cpu", "gpu", "tpu"]
#: marin's annotation for a GPU type: a name such as ``"H100"`` (Fray checks it against ``fray.GPU_TYPES``).
GpuType: TypeAlias = str
#: marin's annotation for a TPU type: a slice name such as ``"v5p-8"`` (checked against ``fray.TPU_TOPOLOGIES``).
TpuType: TypeAlias = str

__all__ = [
    "ANY_REGION",
    "TPU_HBM_BYTES_PER_CHIP",
    "ActorConfig",
    "BinaryEntrypoint",
    "CallableEntrypoint",
    "CpuConfig",
    "DeviceConfig",
    "DeviceKind",
    "Entrypoint",
    "EnvironmentConfig",
    "GpuConfig",
    "GpuType",
    "JobRequest",
    "JobStatus",
    "ResourceConfig",
    "TpuConfig",
    "TpuTopologyInfo",
    "TpuType",
    "create_environment",
    "get_tpu_topology",
    "tpu_family",
    "tpu_hbm_bytes_per_chip",
    "tpu_hbm_capacity_bytes",
]
