"""Fray's own lightweight cluster: the controller's pure logic.

:mod:`fray.cluster.scheduler` decides where pending jobs run, :mod:`fray.cluster.credit`
keeps the per-user credit that orders them, and :mod:`fray.cluster.store` is the
durable SQLite state of the controller. Networking and processes live elsewhere.
"""

from fray.cluster import credit, scheduler, store

__all__ = ["credit", "scheduler", "store"]
