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
worker daemon.
"""
