"""marin's ``fray.local_backend``: the embedded local backend under marin's module path.

``LocalClient`` and ``LocalJobHandle`` are :mod:`fray.local`'s own classes;
``LocalJobHandle(job_id, future)`` wraps a :class:`concurrent.futures.Future` as a job.
"""

from __future__ import annotations

from fray._local_job import LocalJobHandle
from fray.local import LocalClient

__all__ = ["LocalClient", "LocalJobHandle"]
