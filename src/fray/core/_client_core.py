"""The skeleton every backend's client shares, written once: :class:`ClientCore`.

In the spirit of ``concurrent.futures.Executor``: the public methods of the
:class:`~fray.client.Client` protocol live here and do what is the same on every
backend — refuse work after :meth:`~ClientCore.shutdown` or once the calling job was
terminated, check a request's type, apply ``adopt_existing`` (:mod:`fray.core._adopt`), build
an actor group from its members, check a queue's name, make the job context once, and
shut down on leaving a ``with`` block (without waiting after an error). A backend
implements only what differs, the hooks:

============================  ===============================================================
``_start_job(request, detached)``   start a checked job; its handle
``_start_jobs(requests, detached)`` start several (``submit_many``; by default one ``_start_job`` each)
``_create_actor(start)``            start one checked actor (:class:`ActorStart`); its handle and job
``_create_actors(starts)``          start a group's members (by default one ``_create_actor`` each)
``_create_group(name, starts)``     the group itself (by default an ActorGroup of ``_create_actors``)
``_live_job(request)``              a live job of the request's name this client can see (``adopt_existing``)
``_open_queue(name, exist_ok)``     a queue with leases, or ``ConfigError`` naming the alternatives
``_make_job_context()``             the job context (``fray.get_job_context()``), made once
``_owned_work()``                   what :meth:`~ClientCore.shutdown` ends: the client's jobs, its actors
``_end(handles, wait)``             wait for or stop some of them (by default one handle at a time)
``_release()``                      let go of what the engine holds for the client, last in ``shutdown``
``_exit_notice()``                  where the exit notice says the jobs run (None: say nothing)
``_outlives_script(job)``           whether a job keeps running after the script (default: no)
``_leftovers_at_exit()``            apply the driver-exit rule in bulk (the cluster asks its controller once)
============================  ===============================================================

The driver-exit rule and its notice are written once too (:meth:`ClientCore._settle_at_exit`,
:mod:`fray.core._driver_exit`): a backend only says where its jobs run and whether they outlive
the script.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import random
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar

from fray.actor import ActorGroup, ActorHandle, HostedActor, check_actor_request, group_member_names
from fray.actor_config import ActorConfig, check_actor_config_supported
from fray.core._adopt import adopt_or_check, is_named
from fray.core._driver_exit import ExitNotice, Leftovers, report, watch
from fray.core._owned import OwnedWork
from fray.core._pending_notice import watch as watch_pending
from fray.core.inside._runtime import check_terminated
from fray.errors import ConfigError, FrayError
from fray.job import JobHandle, JobRequest, current_job
from fray.job_info import effective_band
from fray.queue import Queue, check_queue_name
from fray.resources import ResourceConfig

if TYPE_CHECKING:
    from fray.client import ClientSpec

__all__ = ["ActorStart", "ClientCore", "check_count", "check_installed", "random_hex", "short_id"]

J = TypeVar("J", bound=JobHandle)
A = TypeVar("A", bound=ActorHandle)


def check_count(value: object, what: str) -> int | None:
    """``value`` if it is None or a whole number >= 1; else a ConfigError naming ``what`` (``"LocalClient(max_threads="``)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{what}{value!r}) must be a whole number >= 1 or None")
    return value


def check_installed(job: str, packages: Sequence[str], backend: str) -> None:
    """Refuse, at submit, a job whose pip packages are not installed here, where ``backend`` runs it.

    Such a backend runs jobs in this Python environment, so packages cannot be installed
    per job; a missing one is named now rather than failing as an ImportError mid-run.
    """
    missing = []
    for requirement in packages:
        match = _REQUIREMENT_NAME.match(requirement)
        if match is None:
            raise ConfigError(f"job {job!r}: pip package {requirement!r} is not a requirement string")
        try:
            importlib.metadata.distribution(match.group(1))
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement)
    if missing:
        raise ConfigError(
            f"job {job!r} needs pip packages {missing} that are not installed; the {backend} backend runs jobs in "
            f"this Python environment, so install them first: pip install {' '.join(missing)}"
        )


_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


# Random hex digits for ids that must be unique, not secret (job ids, attempt keys). ``uuid.uuid4``
# reads ``os.urandom`` on every call, a system call that also lets go of the GIL: in a driver whose
# other threads are busy (Ray's, Fray's reaper) getting it back can cost more than the rest of a
# submit. A PRNG seeded once from the OS is as unique. It is seeded again in a forked child, which
# would otherwise draw the very ids of its parent; the module-level ``random`` functions are not
# used, since a script may seed those.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def random_hex(digits: int) -> str:
    """``digits`` random lowercase hex digits (unique, not secret)."""
    return f"{_ids.getrandbits(4 * digits):0{digits}x}"


def short_id() -> str:
    """Eight hex digits that make a job id unique: ``{name}-{short_id()}``."""
    return random_hex(8)


@dataclass(frozen=True)
class ActorStart:
    """One actor to start, already checked the same way on every backend: what ``_create_actor`` gets."""

    actor_class: type
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    name: str
    resources: ResourceConfig
    """What the actor reserves (:func:`fray.actor.actor_resources`)."""
    config: ActorConfig
    group: tuple[str, int] | None = None
    """``(group name, index)`` for a member of :meth:`ClientCore.create_actor_group`."""


class ClientCore(ABC, Generic[J, A]):
    """What every Fray client does the same way; subclasses implement the hooks (see the module docstring)."""

    BACKEND: ClassVar[str] = "this"
    """The backend's name in messages: ``"the {BACKEND} backend cannot ..."``."""
    ADOPTS: ClassVar[bool] = True
    """Whether :meth:`_live_job` can find a live job by name; if not, ``adopt_existing`` is refused."""
    HONOURS: ClassVar[Collection[str]] = frozenset()
    """marin's job settings the backend honours (``"JobRequest.timeout"``, ...); a job setting another one
    away from its default is refused by name (:meth:`fray.job.JobRequest.marin_settings`, ``docs/marin.md``)."""
    ACTOR_CONFIG: ClassVar[Collection[str] | None] = None
    """The :class:`~fray.actor_config.ActorConfig` fields the backend honours (None: all); others are refused."""
    CONTEXT_FIRST: ClassVar[bool] = False
    """Whether :meth:`shutdown` ends the job context before the jobs: true where its executors are jobs of
    the client, which serve until told (waiting for them first would never end)."""
    ACTORS_END_AT_EXIT: ClassVar[bool] = False
    """Whether the exit hook stops the client's actors (but the detached ones) itself: true where they
    would otherwise outlive the script (each in a job of its own on a cluster)."""

    def __init__(self) -> None:
        self._closed = False
        self._job_context: Any = None
        self._lock = threading.Lock()
        # Jobs submitted with detached=False, stopped at exit; finished ones are dropped as it grows.
        self._attached: OwnedWork[J] = OwnedWork(self._known_finished)
        self._exit_watched = False

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
        script (``detached``; the driver-exit rule of :mod:`fray.core._driver_exit`).
        """
        self._check_open()
        if not isinstance(request, JobRequest):
            raise ConfigError(f"submit() takes a JobRequest, got {type(request).__name__}")
        request = _in_its_band(request)
        live = adopt_or_check(
            self.BACKEND, request, adopt_existing, self._live_job if self.ADOPTS else None, self.HONOURS
        )
        if live is not None:
            return live
        handle = self._start_job(request, detached)
        self._watch_exit()
        if not detached:
            with self._lock:
                self._attached.add(id(handle), handle)  # not job_id: a coalesced submit may not know it yet
        watch_pending(handle, self)  # a job nothing can place says why, once (fray.core._pending_notice)
        return handle

    def submit_many(self, requests: Sequence[JobRequest], *, detached: bool = True) -> list[J]:
        """Submit many jobs at once; their handles in order (see :meth:`fray.client.Client.submit_many`).

        Every request is checked as :meth:`submit` checks it (but nothing is adopted) before
        any starts; then the backend starts them together (``_start_jobs``).
        """
        self._check_open()
        for request in requests:
            if not isinstance(request, JobRequest):
                raise ConfigError(f"submit_many() takes JobRequests, got {type(request).__name__}")
        requests = [_in_its_band(request) for request in requests]
        for request in requests:
            adopt_or_check(self.BACKEND, request, None, None, self.HONOURS)
        handles = self._start_jobs(requests, detached)
        self._watch_exit()
        for handle in handles:
            if not detached:
                with self._lock:
                    self._attached.add(id(handle), handle)
            watch_pending(handle, self)
        return handles

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
        self._watch_exit()
        return self._create_actor(self._actor_start(actor_class, args, kwargs, name, resources, actor_config))[0]

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
        starts = [
            self._actor_start(actor_class, args, kwargs, member, resources, actor_config, (name, index))
            for index, member in enumerate(group_member_names(name, count))
        ]
        self._watch_exit()
        return self._create_group(name, starts)

    def host_actor(
        self, actor_class: type, *args: Any, name: str, actor_config: ActorConfig | None = None, **kwargs: Any
    ) -> HostedActor:
        """Create the actor ``name`` for the caller to stop with ``HostedActor.shutdown()`` (marin's API).

        It is an actor of this client like any other (on the local backend, in this process;
        elsewhere, in its own job), so it also ends with the client.
        """
        self._check_open()
        start = self._actor_start(actor_class, args, kwargs, name, None, actor_config)
        self._watch_exit()
        handle, job = self._create_actor(start)

        def stop() -> None:
            job.terminate()
            job.wait(timeout=60, raise_on_failure=False)

        return HostedActor(handle, stop)

    def create_queue(self, name: str, *, exist_ok: bool = False) -> Queue[Any]:
        """A named queue with leases (:mod:`fray.queue`); ``exist_ok`` attaches to an existing one."""
        self._check_open()
        check_queue_name(name)
        return self._open_queue(name, exist_ok)

    def timeline(self, job: str | JobHandle | None = None, since: float | None = None) -> dict[str, Any]:
        """The client's cluster's jobs as a Chrome trace (Perfetto, ``chrome://tracing``), where a backend keeps them.

        ``job`` keeps one job (a handle, an id or a name); ``since`` keeps the jobs running in the
        last ``since`` seconds. Only the Fray cluster keeps the records a trace is made of
        (``fray timeline``, :mod:`fray.cluster.server.trace`); elsewhere this raises ConfigError.
        """
        raise ConfigError(
            f"timeline(): the {self.BACKEND} backend keeps no timeline of its jobs; a Fray cluster does "
            "(`fray timeline -o trace.json`)"
        )

    def shutdown(self, wait: bool = True) -> None:
        """Refuse new work; with ``wait`` let the client's running jobs finish, else stop them; then stop its actors.

        Jobs first, actors after: running jobs may still be calling the actors. An actor
        created with ``ActorConfig(lifetime="detached")`` outlives the client. A second call
        does nothing.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        jobs, actors = self._owned_work()
        with self._lock:
            context, self._job_context = self._job_context, None
        if context is not None and self.CONTEXT_FIRST:
            context.shutdown()
        self._end(jobs, wait)
        self._end(actors, False)
        if context is not None and not self.CONTEXT_FIRST:
            context.shutdown()
        self._release()

    # ----- the driver-exit rule -------------------------------------------------------------------

    def _settle_at_exit(self) -> None:
        """Apply the driver-exit rule now (what runs when the script exits) and print the notice.

        Attached jobs (``detached=False``) that would outlive the script are stopped; the
        notice names the jobs that keep running, the ones stopped, and the ones that end
        with the script. A client that was shut down has nothing left to settle.
        """
        if self._closed:
            return
        notice = self._exit_notice()
        leftovers = self._leftovers_at_exit()
        if notice is not None:
            report(notice, leftovers)

    def _watch_exit(self) -> None:
        if not self._exit_watched:
            self._exit_watched = True
            watch(self)

    # ----- shared helpers -------------------------------------------------------------------------

    def _check_open(self) -> None:
        check_terminated()
        if self._closed:
            raise self._shut_down()

    def _shut_down(self) -> FrayError:
        """The error for work given to this client after :meth:`shutdown` (backends raise it under their locks too)."""
        return FrayError(f"this {type(self).__name__} is shut down; create a new one")

    def _actor_start(
        self,
        actor_class: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
        resources: ResourceConfig | None,
        actor_config: ActorConfig | None,
        group: tuple[str, int] | None = None,
    ) -> ActorStart:
        reserved, config = check_actor_request(actor_class, name, resources, args, kwargs, actor_config, self.HONOURS)
        if config.priority != (band := effective_band(config.priority)):
            config = dataclasses.replace(config, priority=int(band))
        if self.ACTOR_CONFIG is not None:
            check_actor_config_supported(self.BACKEND, config, self.ACTOR_CONFIG)
        return ActorStart(actor_class, args, kwargs, name, reserved, config, group)

    @staticmethod
    def _child_job_id(name: str) -> str:
        """A new job id for ``name``: a child of the calling job's id inside a job."""
        parent = current_job()
        return f"{parent.job_id}/{name}-{short_id()}" if parent is not None else f"{name}-{short_id()}"

    def _fray_job_context(self) -> Any:
        """This client's job context (``fray.get_job_context()`` inside its jobs), made on first use."""
        with self._lock:
            if self._job_context is None:
                if self._closed:
                    raise self._shut_down()
                self._job_context = self._make_job_context()
            return self._job_context

    # ----- hooks ----------------------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: ClientSpec) -> Self:
        """The client a spec string names (``fray.client.client_from_spec`` calls it by scheme)."""

    @abstractmethod
    def _start_job(self, request: JobRequest, detached: bool) -> J: ...

    def _start_jobs(self, requests: list[JobRequest], detached: bool) -> list[J]:
        """Start checked jobs together; by default one ``_start_job`` each."""
        return [self._start_job(request, detached) for request in requests]

    @abstractmethod
    def _create_actor(self, start: ActorStart) -> tuple[A, JobHandle]: ...

    def _create_actors(self, starts: list[ActorStart]) -> Sequence[tuple[A, JobHandle]]:
        return [self._create_actor(start) for start in starts]

    def _create_group(self, name: str, starts: list[ActorStart]) -> ActorGroup:
        """The group ``name`` of the members ``starts``, started (by default: an ActorGroup of ``_create_actors``)."""
        members = self._create_actors(starts)
        return ActorGroup([handle for handle, _ in members], [job for _, job in members], name)

    def _live_job(self, request: JobRequest) -> J | None:
        """By default: a PENDING or RUNNING job of this client named as ``request``, submitted from the calling job."""
        for job in self._owned_work()[0]:
            if is_named(job.job_id, request.name) and not job.status().finished:
                found: J = job
                return found
        return None

    def _open_queue(self, name: str, exist_ok: bool) -> Queue[Any]:
        raise ConfigError(
            f"create_queue({name!r}): the {self.BACKEND} backend has no queue with leases; keep one in an actor "
            "with fray.queue.actor_queue(client, name), or run the pool on a Fray cluster or Ray"
        )

    @abstractmethod
    def _make_job_context(self) -> Any:  # a fray.context.JobContextBase, which imports this module
        ...

    @abstractmethod
    def _owned_work(self) -> tuple[Sequence[Any], Sequence[Any]]: ...

    def _end(self, handles: Sequence[Any], wait: bool) -> None:
        for handle in handles:
            with contextlib.suppress(Exception):  # best effort: an engine that went away has nothing left to stop
                if wait:
                    handle.wait(raise_on_failure=False)
                else:
                    handle.terminate()

    def _release(self) -> None:
        return None

    def _exit_notice(self) -> ExitNotice | None:
        return ExitNotice(f"the {self.BACKEND} backend")

    def _known_finished(self, job: J) -> bool:
        """Whether ``job`` is known to have finished, without asking the engine (runs under the client's lock)."""
        return False

    def _outlives_script(self, job: J) -> bool:
        return False

    def _leftovers_at_exit(self) -> Leftovers:
        """By default one handle at a time: a job still running keeps running, is stopped, or ends with the script."""
        with self._lock:
            attached = {handle.job_id for handle in self._attached.values()}
        leftovers = Leftovers()
        for job in self._owned_work()[0]:
            with contextlib.suppress(Exception):  # the engine may be half gone at exit: best effort
                if job.status().finished:
                    continue
            if not self._outlives_script(job):
                leftovers.ended.append(job.job_id)
            elif job.job_id in attached:
                with contextlib.suppress(Exception):
                    job.terminate()
                leftovers.stopped.append(job.job_id)
            else:
                leftovers.kept.append(job.job_id)
        if self.ACTORS_END_AT_EXIT:
            self._end(self._owned_work()[1], False)
        return leftovers


def _in_its_band(request: JobRequest) -> JobRequest:
    """``request`` with its band resolved: ``priority=0`` becomes the submitting job's band (top level: interactive).

    Resolved here, where the submitting job is known, so every backend gets a band it can
    act on (1..3) and the job's own submits inherit it (``JobInfo.priority_band``).
    """
    band = effective_band(request.priority)
    if request.priority == band:
        return request
    # A copy with the band set, not dataclasses.replace: the request was checked when it was built,
    # and checking it again cost every submit as much as the rest of the core's work.
    resolved = object.__new__(type(request))  # a quarter of copy.copy's cost
    resolved.__dict__.update(request.__dict__, priority=int(band))
    return resolved
