"""What every backend's ``submit`` does first: refuse settings it cannot honour, and adopt a live job.

``submit(request, adopt_existing=...)`` is marin's: with ``True`` a live job of the same
name is adopted (its handle is returned and nothing is submitted); with ``False`` such a
job raises :class:`~fray.errors.JobAlreadyExists` carrying its ``handle``. Fray's default,
``None``, submits regardless: Fray's job ids are unique, names need not be.

Each backend passes ``find``, its lookup of a live (PENDING or RUNNING) job named as the
request among the jobs it can see, or None when it has none (then ``adopt_existing`` is
refused). It gets the whole request: a backend that cannot read a found job's details back
(Iris) takes them from the request, which names the same job. The
lookup and the submit that follows are two steps: two submits racing with the same name
may both submit.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TypeVar

from fray.errors import ConfigError, JobAlreadyExists
from fray.job import JobHandle, JobRequest, current_job

__all__ = ["adopt_or_check", "is_named"]

H = TypeVar("H", bound=JobHandle)


def is_named(job_id: str, name: str) -> bool:
    """True if ``job_id`` (``{parent id}/{name}-{hex}``, as local, Ray and Monarch build them) is a job named
    ``name`` submitted from the calling job (or from outside any job)."""
    parent = current_job()
    prefix = f"{parent.job_id}/" if parent is not None else ""
    if not job_id.startswith(prefix):
        return False
    own = job_id[len(prefix) :]
    return "/" not in own and own.rsplit("-", 1)[0] == name


def adopt_or_check(
    backend: str,
    request: JobRequest,
    adopt_existing: bool | None,
    find: Callable[[JobRequest], H | None] | None,
    honoured: Collection[str] = (),
) -> H | None:
    """The live job ``submit`` should return instead of submitting, or None to go on and submit.

    Raises ConfigError for a marin setting of ``request`` the backend does not honour (not in
    ``honoured``, its ``HONOURS``), and :class:`JobAlreadyExists` (with ``handle``) when
    ``adopt_existing=False`` finds a live job of the same name.
    """
    refused = request.unsupported(honoured) if isinstance(request, JobRequest) else []
    if refused:
        raise ConfigError(
            f"job {request.name!r}: the {backend} backend cannot honour {', '.join(refused)}; leave "
            f"{'it' if len(refused) == 1 else 'them'} at the default (see docs/marin.md)"
        )
    if adopt_existing is None or not isinstance(request, JobRequest):
        return None
    if not isinstance(adopt_existing, bool):
        raise ConfigError(f"submit(adopt_existing={adopt_existing!r}) must be True, False or None")
    if find is None:
        raise ConfigError(
            f"job {request.name!r}: the {backend} backend cannot look up a live job by name, so "
            f"submit(adopt_existing={adopt_existing}) is refused there; submit without adopt_existing"
        )
    live = find(request)
    if live is None or adopt_existing:
        return live
    raise JobAlreadyExists(
        request.name,
        live,
        reason=f"it is live as {live.job_id!r}; adopt it with submit(..., adopt_existing=True), terminate it "
        "first, or pick another name",
    )
