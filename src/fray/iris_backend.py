"""marin's ``fray.iris_backend``: Fray's Iris backend under marin's module path (needs ``fray[iris]``, Python >= 3.12).

``FrayIrisClient`` *is* :class:`fray.iris.client.IrisClient`; the two converters map a
:class:`~fray.resources.ResourceConfig` onto Iris's submit arguments the way Fray's
backend does (:func:`fray.iris.mapping.placement`).
"""

from __future__ import annotations

from typing import Any

from fray.iris.client import IrisClient as FrayIrisClient
from fray.iris.mapping import placement
from fray.resources import ResourceConfig

__all__ = ["FrayIrisClient", "convert_constraints", "convert_resources"]


def convert_resources(resources: ResourceConfig) -> Any:
    """Iris's ``ResourceSpec`` for one task of a job with ``resources``."""
    return placement(resources, resources.replicas).resources


def convert_constraints(resources: ResourceConfig) -> list[Any]:
    """Iris's placement constraints (preemptible, regions, zone) for ``resources``."""
    return list(placement(resources, resources.replicas).constraints)
