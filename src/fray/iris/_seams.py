"""Iris's objects that marin's tests replace, read where marin's tests replace them.

marin's ``fray.iris_backend`` is its seam: its tests patch ``iris_backend.ActorServer``,
``ActorClient``, ``iris_ctx`` and ``get_job_info`` to stand in for a cluster. Fray's Iris code
reads those names here at call time: from ``fray.iris_backend`` when that module is loaded (a
patch can only have been made there if it is), else Iris's own. Read through ``sys.modules`` and
not imported, so that ``fray.iris_backend`` (which re-exports this package) stays the top of the
import graph.
"""

from __future__ import annotations

import sys
from typing import Any

from iris.actor.client import ActorClient
from iris.actor.server import ActorServer
from iris.client.client import iris_ctx
from iris.cluster.client.job_info import get_job_info

__all__ = ["seam"]

_IRIS: dict[str, Any] = {
    "ActorClient": ActorClient,
    "ActorServer": ActorServer,
    "iris_ctx": iris_ctx,
    "get_job_info": get_job_info,
}


def seam(name: str) -> Any:
    """Iris's ``name`` (one of ``ActorClient``, ``ActorServer``, ``iris_ctx``, ``get_job_info``) as used now."""
    module = sys.modules.get("fray.iris_backend")
    return getattr(module, name) if module is not None else _IRIS[name]
