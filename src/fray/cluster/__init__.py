"""Fray's own lightweight cluster (``fray://host:port``).

* :mod:`fray.cluster.client` -- the :class:`~fray.client.Client` users hold; it talks to
  the controller through :mod:`fray.cluster.controller_client` and to actors directly.
* :mod:`fray.cluster.controller` -- the controller: :mod:`fray.cluster.store` (durable
  SQLite state, records in :mod:`fray.cluster.records`), :mod:`fray.cluster.scheduler`
  (where pending jobs run, over :mod:`fray.cluster.capacity`), :mod:`fray.cluster.credit`
  (the per-user credit that orders them).
* :mod:`fray.cluster.worker` -- the worker daemon that runs tasks as processes.
* :mod:`fray.cluster.messages` -- what they send each other.

Nothing is imported here, so that a client never loads the controller's store or the
worker daemon. marin's ``fray.cluster`` names (``from fray.cluster import ResourceConfig``)
are found on first use in :mod:`fray.types`, which holds only values.
"""

from __future__ import annotations

from typing import Any

_MARIN_NAMES = (
    "ANY_REGION",
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
)


def __getattr__(name: str) -> Any:
    """marin's value names, taken from :mod:`fray.types` (the same objects)."""
    if name in _MARIN_NAMES:
        import fray.types

        return getattr(fray.types, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
