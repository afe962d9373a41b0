"""The Ray backend (``pip install "fray[ray]"``): :class:`RayClient`.

Importing :mod:`fray` never imports Ray; importing this package does.
"""

from fray.ray.client import RayActorHandle, RayClient, RayJobHandle

__all__ = ["RayActorHandle", "RayClient", "RayJobHandle"]
