"""Fray's own lightweight cluster (``fray://host:port``), as three packages and what they share.

* :mod:`fray.cluster.client` -- the client side: the :class:`~fray.client.Client` users hold
  (:class:`~fray.cluster.client.ClusterClient`), actor handles, queues, submit coalescing and the
  job context of executor jobs (:mod:`fray.cluster.client.context`).
* :mod:`fray.cluster.server` -- the server side: the controller (:mod:`fray.cluster.server.controller`:
  :class:`~fray.cluster.server.controller.Controller` and its ``ControllerService``), its durable SQLite
  state (:mod:`fray.cluster.server.store`), placement (:mod:`fray.cluster.server.scheduler`) and credit
  (:mod:`fray.cluster.server.credit`), the operator API (:mod:`fray.cluster.server.ops`), retention,
  the dashboard (:mod:`fray.cluster.server.dashboard`), the autoscaler
  (:mod:`fray.cluster.server.autoscale`), the worker daemon (:mod:`fray.cluster.server.worker`), what
  runs in a task's process (:mod:`fray.cluster.server.taskproc`), task environments
  (:mod:`fray.cluster.server.envs`) and the local launcher (:mod:`fray.cluster.server.launcher`).
* :mod:`fray.cluster.protocol` -- what both sides import: the messages they send each other
  (:mod:`fray.cluster.protocol.messages`), the records, capacities and credentials, their plain-data
  codec, and the way to reach the controller (:mod:`fray.cluster.protocol.controller_client`).
* :mod:`fray.cluster.rpc` -- the actor RPC layer both sides speak (and the controller's data-only RPC).

Nothing is imported here (nor in :mod:`fray.cluster.server`), so that a client never loads the
controller's store or the worker daemon. marin's ``fray.cluster`` names (``from fray.cluster import
ResourceConfig``) are found on first use in :mod:`fray.types`, which holds only values.
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
