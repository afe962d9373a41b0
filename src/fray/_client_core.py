"""The skeleton every backend's client shares, written once: :class:`ClientCore`.

In the spirit of ``concurrent.futures.Executor``: the public methods of the
:class:`~fray.client.Client` protocol live here and do what is the same on every
backend — refuse work after :meth:`~ClientCore.shutdown` or once the calling job was
terminated, check a request's type, apply ``adopt_existing`` (:mod:`fray._adopt`), build
an actor group from its members, check a queue's name, make the job context once, and
shut down on leaving a ``with`` block (without waiting after an error). A backend
implements only what differs, the hooks:

============================  ===============================================================
``_start_job(request, detached)``   start a checked job; its handle
``_create_actor(..., group)``       start one actor (a member of ``group`` when given); its handle and job
``_live_job(request)``              a live job of the request's name this client can see (``adopt_existing``)
``_open_queue(name, exist_ok)``     a queue with leases, or ``ConfigError`` naming the alternatives
``_make_job_context()``             the job context (``fray.get_job_context()``), made once
``shutdown(wait)``                  stop what the client owns
============================  ===============================================================

The driver-exit rule and its notice are shared too (:mod:`fray._driver_exit`); each
backend says in ``_start_job`` whether its jobs outlive the script.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, ClassVar, Generic, Self, TypeVar

from fray._adopt import adopt_or_check
from fray._pending_notice import watch as watch_pending
from fray._runtime import check_terminated
from fray.actor import ActorGroup, ActorHandle, group_member_names
from fray.actor_config import ActorConfig
from fray.errors import ConfigError, FrayError
from fray.job import JobHandle, JobRequest
from fray.queue import Queue, check_queue_name
from fray.resources import ResourceConfig

__all__ = ["ClientCore"]

J = TypeVar("J", bound=JobHandle)
A = TypeVar("A", bound=ActorHandle)


class ClientCore(Generic[J, A]):
    """What every Fray client does the same way; subclasses implement the hooks (see the module docstring)."""

    BACKEND: ClassVar[str] = "this"
    """The backend's name in messages: ``"the {BACKEND} backend cannot ..."``."""
    ADOPTS: ClassVar[bool] = True
    """Whether :meth:`_live_job` can find a live job by name; if not, ``adopt_existing`` is refused."""

    def __init__(self) -> None:
        self._closed = False
        self._job_context: Any = None
        self._lock = threading.Lock()

    # ----- the protocol ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` was called; a closed client accepts no more work."""
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # After an error nobody will wait for the remaining work, so stop it instead of hanging.
        self.shutdown(wait=exc_type is None)

    def submit(self, request: JobRequest, adopt_existing: bool | None = None, *, detached: bool = True) -> J:
        """Submit a job; returns its handle at once (see :meth:`fray.client.Client.submit`).

        The class docstring says where this backend runs jobs and whether they outlive the
        script (``detached``; the driver-exit rule of :mod:`fray._driver_exit`).
        """
        self._check_open()
        if not isinstance(request, JobRequest):
            raise ConfigError(f"submit() takes a JobRequest, got {type(request).__name__}")
        live = adopt_or_check(self.BACKEND, request, adopt_existing, self._live_job if self.ADOPTS else None)
        if live is not None:
            return live
        handle = self._start_job(request, detached)
        watch_pending(handle, self)  # a job nothing can place says why, once (fray._pending_notice)
        return handle

    def create_actor(
        self,
        actor_class: type,
        *args: Any,
        name: str,
        resources: ResourceConfig | None = None,
        actor_config: ActorConfig | None = None,
        **kwargs: Any,
    ) -> A:
        """Create the actor ``name`` as ``actor_class(*args, **kwargs)``; its handle works at once.

        Which :class:`~fray.actor_config.ActorConfig` fields this backend honours is in the
        class docstring; any other is refused with a ``ConfigError`` naming it.
        """
        self._check_open()
        return self._create_actor(actor_class, args, kwargs, name, resources, actor_config, None)[0]

    def create_actor_group(
        self,
        actor_class: type,
        *args: Any,
        name: str,
        count: int,
        resources: ResourceConfig | None = None,
        actor_config: ActorConfig | None = None,
        **kwargs: Any,
    ) -> ActorGroup:
        """Create ``count`` actors ``{name}-0`` ... ``{name}-{count-1}``, each its own job; returns at once."""
        self._check_open()
        members = [
            self._create_actor(actor_class, args, kwargs, member, resources, actor_config, (name, index))
            for index, member in enumerate(group_member_names(name, count))
        ]
        return ActorGroup([handle for handle, _ in members], [job for _, job in members], name)

    def create_queue(self, name: str, *, exist_ok: bool = False) -> Queue[Any]:
        """A named queue with leases (:mod:`fray.queue`); ``exist_ok`` attaches to an existing one."""
        self._check_open()
        check_queue_name(name)
        return self._open_queue(name, exist_ok)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the client's jobs and actors; ``wait`` for running jobs to finish first."""
        raise NotImplementedError

    # ----- shared helpers -------------------------------------------------------------------------

    def _check_open(self) -> None:
        check_terminated()
        if self._closed:
            raise self._shut_down()

    def _shut_down(self) -> FrayError:
        """The error for work given to this client after :meth:`shutdown` (backends raise it under their locks too)."""
        return FrayError(f"this {type(self).__name__} is shut down; create a new one")

    def _fray_job_context(self) -> Any:
        """This client's job context (``fray.get_job_context()`` inside its jobs), made on first use."""
        with self._lock:
            if self._job_context is None:
                if self._closed:
                    raise self._shut_down()
                self._job_context = self._make_job_context()
            return self._job_context

    # ----- hooks ----------------------------------------------------------------------------------

    def _start_job(self, request: JobRequest, detached: bool) -> J:
        raise NotImplementedError

    def _create_actor(
        self,
        actor_class: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
        resources: ResourceConfig | None,
        actor_config: ActorConfig | None,
        group: tuple[str, int] | None,
    ) -> tuple[A, JobHandle]:
        raise NotImplementedError

    def _live_job(self, request: JobRequest) -> J | None:
        return None

    def _open_queue(self, name: str, exist_ok: bool) -> Queue[Any]:
        raise ConfigError(
            f"create_queue({name!r}): the {self.BACKEND} backend has no queue with leases; keep one in an actor "
            "with fray.queue.actor_queue(client, name), or run the pool on a Fray cluster or Ray"
        )

    def _make_job_context(self) -> Any:
        raise NotImplementedError
