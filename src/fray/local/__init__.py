"""The embedded local backend: jobs as threads (callables) or subprocesses (binaries), actors as objects.

It needs no setup and honours the whole :class:`~fray.client.Client` protocol, so a
pipeline or RL loop can be developed and tested with nothing else installed. What
cannot be isolated inside one process is documented on :class:`LocalClient`. Jobs
and their handles live in :mod:`fray.local._local_job`, actors in :mod:`fray.local._local_actor`.

The package also holds the backend's parts: :mod:`fray.local._local_job` (jobs and their
handles), :mod:`fray.local._local_runner` (running a job's attempts),
:mod:`fray.local._local_actor` (actors). Its job level on threads,
:class:`~fray.LocalJobContext`, is in :mod:`fray.joblevel`.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Sequence
from typing import Any, ClassVar, Self, cast

from fray.actor import ActorGroup
from fray.actor_config import ActorConfig
from fray.client import ClientSpec
from fray.core._client_core import ActorStart, ClientCore, check_count, check_installed, short_id
from fray.core._driver_exit import ExitNotice
from fray.core._owned import OwnedWork
from fray.core._serialization import call_parts, check_picklable
from fray.errors import ConfigError, JobAlreadyExists
from fray.job import CallableEntrypoint, EnvironmentConfig, JobInfo, JobRequest
from fray.job_info import _current_job
from fray.joblevel._local_context import LocalJobContext
from fray.local._local_actor import LocalActor, LocalActorHandle
from fray.local._local_job import LocalJob, LocalJobHandle, stop_deadline, wait_for_stop
from fray.local._local_runner import JobRunner, local_device
from fray.queue import LocalQueue, queue_exists
from fray.resources import ResourceConfig

__all__ = ["LocalActorHandle", "LocalClient", "LocalJobHandle", "MarinLocalClient"]


def _never_started(job: LocalJob) -> None:
    # Interrupted before its thread started (e.g. the submitting job was terminated mid-call):
    # it never will run, so it must not sit PENDING for shutdown(wait=True) to wait on forever.
    job.lifecycle.stop()


_WHY_ENDED = "the local backend runs jobs inside the script's process"


class MarinLocalClient(ClientCore["LocalJobHandle", "LocalActorHandle"]):
    """The embedded backend with marin's local rules: marin's ``fray.local_backend.LocalClient``.

    It runs everything inside this process, as :class:`LocalClient` (its subclass, and
    Fray's default) does, and keeps the three rules marin's own local backend has, so
    that code and tests written against it behave as they did:

    * ``create_actor`` and ``create_actor_group`` return once the constructors ran (they
      run side by side, each on its member's thread); a constructor that raised is raised
      there, in Fray's one form (an :class:`~fray.errors.ActorDiedError` that is also of the
      user's class), after the group's other members were stopped;
    * callables, arguments and results are passed as they are, never pickled;
    * job names are not tracked: ``submit(..., adopt_existing=...)`` always submits.

    Fray's :class:`LocalClient` refines these: handles come back at once and members become
    ready independently, as on every other backend, values are checked to pickle as they
    would have to elsewhere, and ``adopt_existing`` finds the client's live jobs by name.
    Everything else (threads, subprocesses, retries, terminate) is one implementation.
    """

    #: Whether create_actor(_group) waits for the constructors (marin's local rule).
    CONSTRUCTS_AT_CREATE: ClassVar[bool] = True
    #: Whether values are checked to pickle unless told (marin's local rule: never).
    CHECKS_PICKLING: ClassVar[bool] = False

    BACKEND = "local"
    HONOURS = frozenset(
        {"JobRequest.processes_per_task", "JobRequest.priority", "JobRequest.timeout", "EnvironmentConfig.extras"}
    )

    def __init__(
        self,
        max_threads: int | None = None,
        *,
        namespace: str | None = None,
        echo_logs: bool = True,
        check_pickling: bool | None = None,
    ) -> None:
        self.max_threads = check_count(max_threads, "LocalClient(max_threads=")
        super().__init__()
        self.client_id = short_id()
        self.namespace = namespace or f"local-{self.client_id}"
        #: Refuse what another backend could not pickle (off: values are passed as they are, unchecked).
        self.check_pickling = self.CHECKS_PICKLING if check_pickling is None else bool(check_pickling)
        self._echo = echo_logs
        self._jobs: OwnedWork[LocalJob] = OwnedWork(lambda job: job.lifecycle.finished)
        self._actors_by_job: dict[str, LocalActor] = {}
        self._actors_by_name: dict[str, LocalActor] = {}
        self._runner = JobRunner(self, self._parent_namespace, max_threads)
        self._queues: dict[str, LocalQueue[Any]] = {}

    @classmethod
    def from_spec(cls, spec: ClientSpec) -> Self:
        """Build from ``local``, ``local?threads=N`` and/or ``local?pickle=0|1`` (``check_pickling``)."""
        if spec.address is not None:
            raise spec.invalid("the local backend takes no address")
        options = spec.only("local", "threads", "pickle")
        pickle, threads = options.get("pickle"), options.get("threads", "")
        if pickle not in (None, "0", "1"):
            raise spec.invalid(
                f"pickle={pickle!r} must be 1 (check that everything pickles) or 0 (pass values as they are)"
            )
        if threads and (not threads.isdigit() or int(threads) < 1):
            raise spec.invalid(f"threads={threads!r} must be a whole number >= 1")
        return cls(
            max_threads=int(threads) if threads else None, check_pickling=None if pickle is None else pickle == "1"
        )

    def __repr__(self) -> str:
        pickling = "" if self.check_pickling == self.CHECKS_PICKLING else f", check_pickling={self.check_pickling}"
        return f"{type(self).__name__}(namespace={self.namespace!r}, max_threads={self.max_threads}{pickling})"

    # ----- marin's local rules ----------------------------------------------------------------

    def create_actor(
        self,
        actor_class: type,
        *args: Any,
        name: str,
        resources: ResourceConfig | None = None,
        actor_config: ActorConfig | None = None,
        **kwargs: Any,
    ) -> LocalActorHandle:
        """Create the actor ``name``; see :meth:`~fray.core._client_core.ClientCore.create_actor`.

        Where :attr:`CONSTRUCTS_AT_CREATE` (marin's rule), this returns once the constructor
        ran, and raises what it raised.
        """
        handle = super().create_actor(
            actor_class, *args, name=name, resources=resources, actor_config=actor_config, **kwargs
        )
        if self.CONSTRUCTS_AT_CREATE:
            handle._fray_ready().result()
        return handle

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
        """Create ``count`` actors; see :meth:`~fray.core._client_core.ClientCore.create_actor_group`.

        Where :attr:`CONSTRUCTS_AT_CREATE` (marin's rule), this returns once every constructor
        ran; when one raised, the others are stopped and its error is raised here.
        """
        group = super().create_actor_group(
            actor_class, *args, name=name, count=count, resources=resources, actor_config=actor_config, **kwargs
        )
        if self.CONSTRUCTS_AT_CREATE:
            try:
                group.wait_ready(timeout=None)
            except BaseException:
                group.shutdown()
                raise
        return group

    def _live_job(self, request: JobRequest) -> LocalJobHandle | None:
        # marin's local backend does not track job names: adopt_existing never finds one.
        return None

    # ----- jobs -------------------------------------------------------------------------------

    def _start_job(self, request: JobRequest, detached: bool) -> LocalJobHandle:
        self._runner.check(request)  # processes_per_task, extras (fray.local._local_runner)
        entry = request.entrypoint
        environment = request.environment or EnvironmentConfig()
        if isinstance(entry, CallableEntrypoint):
            if self.check_pickling:
                check_picklable(f"job {request.name!r}", call_parts(entry.callable, entry.args, entry.kwargs))
            check_installed(request.name, environment.pip_packages, self.BACKEND)
            # Replicas of several processes each run as subprocesses and take no thread slot.
            if self.max_threads is not None and request.replicas > self.max_threads and request.processes_per_task == 1:
                raise ConfigError(
                    f"job {request.name!r} asks for {request.replicas} replicas, which start all together, but this "
                    f"LocalClient runs at most {self.max_threads} threads; raise threads or lower replicas"
                )
        job = self._new_job(
            request.name, request.max_retries_failure, request.max_retries_preemption, request.timeout_seconds
        )
        try:
            if environment.docker_image:
                job.logs.write(f"[fray] the local backend ignores docker_image={environment.docker_image!r}\n")
            context = contextvars.copy_context()
            launcher = threading.Thread(
                target=self._runner.run_job,
                args=(job, request, environment, context),
                name=f"fray-job-{job.job_id}",
                daemon=True,
            )
            launcher.start()
        except BaseException:
            _never_started(job)
            raise
        return LocalJobHandle(job)

    def _new_job(
        self, name: str, max_retries_failure: int = 0, max_retries_preemption: int = 0, timeout: float | None = None
    ) -> LocalJob:
        job_id = self._child_job_id(name)
        job = LocalJob(
            self.client_id,
            job_id,
            name,
            echo=self._echo,
            wake=self._runner.wake,
            max_retries_failure=max_retries_failure,
            max_retries_preemption=max_retries_preemption,
            timeout=timeout,
        )
        with self._lock:
            if self._closed:
                raise self._shut_down()
            self._jobs.add(job_id, job)
        return job

    def _parent_namespace(self) -> str:
        parent = _current_job.get()
        return parent.namespace if parent is not None else self.namespace

    # ----- actors -----------------------------------------------------------------------------

    def _create_actor(self, start: ActorStart) -> tuple[LocalActorHandle, LocalJobHandle]:
        name = start.name
        with self._lock:
            if name in self._actors_by_name:
                raise JobAlreadyExists(
                    name,
                    reason="an actor of this name is already running in this client; shut it down first or pick "
                    "another name",
                )
        job = self._new_job(name)
        try:
            info = JobInfo(
                job.job_id,
                name,
                0,
                1,
                self._parent_namespace(),
                0,
                local_device(start.resources),
                priority_band=start.config.priority,
            )
            actor = LocalActor(
                self,
                job,
                start.actor_class,
                info,
                self._forget_actor,
                start.config,
                start.group,
                check_pickling=self.check_pickling,
            )
            with self._lock:
                if name in self._actors_by_name:  # lost a race with another creator
                    self._jobs.pop(job.job_id)
                    raise JobAlreadyExists(name, reason="an actor of this name is already running in this client")
                self._actors_by_name[name] = actor
                self._actors_by_job[job.job_id] = actor
            actor.start(start.args, start.kwargs, contextvars.copy_context())
        except BaseException:
            _never_started(job)
            raise
        return LocalActorHandle(actor, start.actor_class, name, self.client_id), LocalJobHandle(job)

    def _forget_actor(self, actor: LocalActor) -> None:
        with self._lock:
            if self._actors_by_name.get(actor.name) is actor:
                del self._actors_by_name[actor.name]

    # ----- the job level ----------------------------------------------------------------------

    def _make_job_context(self) -> LocalJobContext:
        """This client's job context (``fray.get_job_context()`` here): tasks on threads."""
        return LocalJobContext(client=self)

    def _open_queue(self, name: str, exist_ok: bool) -> LocalQueue[Any]:
        """A queue with leases in this process (see :mod:`fray.queue`); ``exist_ok`` returns the existing one."""
        with self._lock:
            if self._closed:
                raise self._shut_down()
            queue = self._queues.get(name)
            if queue is not None:
                if not exist_ok:
                    raise queue_exists(name, "in this LocalClient")
                return queue
            queue = self._queues[name] = LocalQueue(name)
            return queue

    # ----- lifecycle --------------------------------------------------------------------------

    def _owned_work(self) -> tuple[list[LocalJobHandle], list[LocalJobHandle]]:
        with self._lock:
            jobs, actors = list(self._jobs.values()), dict(self._actors_by_job)
        # Detached actors outlive the client (not the process: nothing of this backend can).
        hosts = [LocalJobHandle(j) for j in jobs if j.job_id in actors and not actors[j.job_id].config.detached]
        return [LocalJobHandle(job) for job in jobs if job.job_id not in actors], hosts

    def _known_finished(self, job: LocalJobHandle) -> bool:
        return job._job.lifecycle.finished

    def _exit_notice(self) -> ExitNotice:
        # Its jobs end with the process (local._local_job's exit hook, which runs after the notice).
        return ExitNotice(f"the local backend ({self.namespace})", why_ended=_WHY_ENDED)

    def _end(self, handles: Sequence[LocalJobHandle], wait: bool) -> None:
        jobs = [cast(LocalJob, handle._job) for handle in handles]
        if wait:
            for job in jobs:
                job.lifecycle.wait_done()
        # Stopped together, under one deadline: one slow thread does not delay the others' stop.
        for job in jobs:
            if not job.lifecycle.finished:
                job.request_stop()
        wait_for_stop(jobs, stop_deadline())


class LocalClient(MarinLocalClient):
    """Runs everything inside this process: callable jobs in threads, binary jobs as subprocesses,
    actors as objects each served by its own thread. Fray's default client.

    ``max_threads`` bounds how many callable replicas run at once (others stay PENDING);
    actors do not count against it. Limits of running in one process: resources are
    not enforced; ``max_retries_preemption`` applies only to :func:`fray.testing.preempt`;
    ``docker_image`` is ignored (noted in the job's log); ``pip_packages`` must already
    be installed; env vars of callable jobs are set process-wide while they run.

    As on every other backend, ``create_actor`` returns a deferred handle at once and a
    group's members become ready independently (a constructor's error reaches
    ``wait_ready`` and the calls); ``submit(..., adopt_existing=...)`` looks up the client's
    live jobs by name (:mod:`fray.core._adopt`). Its base, :class:`MarinLocalClient`, is
    marin's ``fray.local_backend.LocalClient``: the same backend with marin's local rules.

    Callables, their arguments, actor calls and their results are passed to the job or
    actor as they are (the very objects), but first checked to pickle: what every other
    backend could not ship -- a job's callable and arguments at submit, an actor call's
    arguments in the caller and its return value -- is refused with
    :class:`~fray.errors.SerializationError`, so that code that passes here does not fail
    later on a cluster. Plain data (builtin scalars in builtin containers) is known to
    pickle and costs nothing. ``check_pickling=False`` (spec ``local?pickle=0``) skips the
    check, for speed with large non-plain values; :class:`MarinLocalClient` never checks.

    How ``terminate()`` stops threads is on :meth:`fray.local._local_job.LocalJobHandle.terminate`;
    a terminated actor's calls fail with ``ActorDiedError`` at once.

    Jobs run inside this process, so they end with it whatever ``detached`` says (the
    driver-exit rule, :mod:`fray.core._driver_exit`); at exit, Fray names the ones that were
    still running. Actors run on their own thread(s) and every
    :class:`~fray.actor_config.ActorConfig` field is honoured; resources reserve nothing
    (actors take no thread slots); a ``detached`` actor survives :meth:`shutdown` but, like
    everything of this backend, ends with the process.
    """

    CONSTRUCTS_AT_CREATE = False
    CHECKS_PICKLING = True

    def _live_job(self, request: JobRequest) -> LocalJobHandle | None:
        return ClientCore._live_job(self, request)
