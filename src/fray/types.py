"""marin's ``fray.types``: the values of a job, under the module path marin's code imports.

Every name here *is* Fray's own type or function (``fray.types.ResourceConfig is
fray.ResourceConfig``); marin's extra fields and methods live on those types. See
``docs/marin.md`` for each name and what still differs.
"""

from __future__ import annotations

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

__all__ = [
    "ANY_REGION",
    "TPU_HBM_BYTES_PER_CHIP",
    "ActorConfig",
    "BinaryEntrypoint",
    "CallableEntrypoint",
    "CpuConfig",
    "DeviceConfig",
    "Entrypoint",
    "EnvironmentConfig",
    "GpuConfig",
    "JobRequest",
    "JobStatus",
    "ResourceConfig",
    "TpuConfig",
    "TpuTopologyInfo",
    "create_environment",
    "get_tpu_topology",
    "tpu_family",
    "tpu_hbm_bytes_per_chip",
    "tpu_hbm_capacity_bytes",
]
