"""The Ray backend (``pip install "fray[ray]"``): :class:`RayClient`.

Importing :mod:`fray` never imports Ray; importing this package does.
"""

from fray.ray.actors import RayActorHandle
from fray.ray.client import RayClient
from fray.ray.jobs import RayJobHandle

__all__ = ["RayActorHandle", "RayClient", "RayJobHandle"]
