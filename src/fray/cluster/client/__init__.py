"""The ``fray://host:port`` backend: a :class:`~fray.client.Client` on a Fray cluster.

Jobs are submitted to the controller; actors are jobs that serve an
:class:`~fray.cluster.rpc.ActorServer` and register an endpoint, and handles reach them
over the actor RPC layer directly (the controller is only asked where they are).

The package is the client side of the cluster: besides the client it holds
:mod:`fray.cluster.client.actor_handle`, :mod:`fray.cluster.client.queue` and the
client's helpers at submit (device placement, submit batching). It never loads the
controller, the store or the worker daemon.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import getpass
import os
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from fray.client import ClientSpec
from fray.cluster.client._lender import lend_through
from fray.cluster.client._placement import placed, placed_request
from fray.cluster.client._submit_batch import SubmitBatcher, batches
from fray.cluster.client.actor_handle import ClusterActorHandle, live_clients
from fray.cluster.client.context import ClusterJobContext
from fray.cluster.client.queue import ClusterQueue
from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.protocol.controller_client import CredentialLike, connect_controller, ops_client, resolve_credential
from fray.cluster.protocol.credentials import Credential
from fray.cluster.protocol.messages import JobSpec, JobView
from fray.cluster.rpc.namespace import resolve_namespace
from fray.cluster.server.taskproc._actor_host import host_actor
from fray.core._client_core import ActorStart, ClientCore
from fray.core._driver_exit import ExitNotice, Leftovers
from fray.core._lifecycle import Failure
from fray.core._remote import job_failed
from fray.core.inside._logcapture import log_tail
from fray.errors import ConfigError, FrayError, NotFound
from fray.job import (
    Entrypoint,
    EnvironmentConfig,
    JobHandle,
    JobHandleBase,
    JobRequest,
    JobStatus,
    JobSummary,
    timeout_error,
)
from fray.process._ranks import check_processes
from fray.stacks import ProcessStacks

__all__ = ["ClusterActorHandle", "ClusterClient", "ClusterJobHandle"]


def _raise_for(view: JobView) -> None:
    """Raise what ``wait()`` raises for a FAILED job: its final failure, as on every backend."""
    if view.state != JobStatus.FAILED:
        return
    if view.failure is not None:
        raise Failure.decode(view.failure).error(view.job_id)
    raise job_failed(view.job_id, view.error or "failed")


def _settled_status(view: JobView) -> JobStatus:
    """The job's status for waiters: a finished job whose killed processes may still run is not done yet."""
    if view.state.finished and not view.settled:
        return JobStatus.RUNNING
    return view.state


# How long shutdown() waits for the processes of the jobs and actors it stopped to be gone.
_STOP_SECONDS = 10.0
# How long each controller call at interpreter exit may take: a dead controller must not hold the exit.
_EXIT_SECONDS = 2.0

# A long-poll never blocks longer than this, so a waiter without a timeout still hears of
# a controller that went away (and wait_all can re-check its own deadline).
_POLL_SECONDS = 10.0


class ClusterJobHandle(JobHandleBase):
    """A job on a Fray cluster. Picklable: it keeps the controller address and job id."""

    def __init__(self, address: str, job_id: str | Future[str], token: CredentialLike = None) -> None:
        """``job_id`` is the id, or (for a submit still on its way to the controller) its future."""
        self._address = address
        self._id = job_id
        self._token = resolve_credential(token)
        self._controller = connect_controller(address, self._token)

    def __reduce__(self) -> tuple[object, ...]:
        return (ClusterJobHandle, (self._address, self._job_id))

    def __repr__(self) -> str:
        shown = (
            self._id if isinstance(self._id, str) or not self._id.done() else self._id.exception() or self._id.result()
        )
        return f"ClusterJobHandle({'being submitted' if isinstance(shown, Future) else shown!r} at {self._address})"

    @property
    def _job_id(self) -> str:
        # A coalesced submit (fray.cluster.client._submit_batch) is known by id once the controller
        # answered; a submit it refused raises its error from every use of the handle.
        if not isinstance(self._id, str):
            self._id = self._id.result()
        return self._id

    @property
    def job_id(self) -> str:
        """The job's id: ``{name}-{hex}``, prefixed by the parent's id for child jobs.

        Right after ``submit`` this waits for the controller's answer (one round trip);
        if the controller refused the job, its error is raised here.
        """
        return self._job_id

    def view(self) -> JobView:
        """Everything the controller knows about the job."""
        view: JobView = self._controller.job(self._job_id)
        return view

    def status(self) -> JobStatus:
        """The job's current status."""
        return self.view().state

    def wait(self, timeout: float | None = None, *, raise_on_failure: bool = True) -> JobStatus:
        """Block until the job finished (and its killed processes are gone); raise JobFailed on failure."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = _POLL_SECONDS if deadline is None else max(0.0, deadline - time.monotonic())
            view: JobView = self._controller.wait([self._job_id], min(remaining, _POLL_SECONDS))[0]
            if view.state.finished and view.settled:
                if raise_on_failure:
                    _raise_for(view)
                return view.state
            if deadline is not None and time.monotonic() >= deadline:
                raise timeout_error(_summary(view), timeout)

    @classmethod
    def _fray_wait_some(cls, jobs: Sequence[ClusterJobHandle], timeout: float | None) -> list[JobStatus]:
        """Block until one of ``jobs`` finished (or ``timeout``); their statuses, in order (see ``wait_all``).

        One long-poll per controller covers all of its jobs; jobs on several controllers
        are polled side by side, and the first answer with a finished job ends the wait.
        """
        seconds = _POLL_SECONDS if timeout is None else min(max(timeout, 0.0), _POLL_SECONDS)
        groups: dict[tuple[str, Credential | None], list[int]] = {}
        for index, job in enumerate(jobs):
            groups.setdefault((job._address, job._token), []).append(index)
        statuses: list[JobStatus | None] = [None] * len(jobs)

        def poll(indices: list[int], wait: float) -> bool:
            answers = jobs[indices[0]]._controller.wait_status([jobs[i]._job_id for i in indices], wait)
            # A finished job whose killed processes may still run is not done yet.
            found = [
                JobStatus.RUNNING if JobStatus(state).finished and not settled else JobStatus(state)
                for state, settled in answers
            ]
            for index, status in zip(indices, found, strict=True):
                statuses[index] = status
            return any(status.finished for status in found)

        if len(groups) == 1:
            poll(next(iter(groups.values())), seconds)
        else:
            pool = concurrent.futures.ThreadPoolExecutor(len(groups), thread_name_prefix="fray-wait")
            try:
                pending = {pool.submit(poll, indices, seconds) for indices in groups.values()}
                while pending:
                    done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                    if any(future.result() for future in done):
                        break
                # The other controllers' polls end on their own (within their timeout); read them now.
                for indices in groups.values():
                    if any(statuses[i] is None for i in indices):
                        poll(indices, 0.0)
            finally:
                pool.shutdown(wait=False, cancel_futures=True)
        return [status if status is not None else JobStatus.RUNNING for status in statuses]

    def terminate(self) -> None:
        """Stop the job's tasks (and its child jobs) on every worker."""
        self._controller.terminate(self._job_id)

    def _fray_preempt(self, replica: int | None) -> None:
        """Have the controller lose the replica's task as a preemption (see :func:`fray.testing.preempt`)."""
        self._controller.preempt(self._job_id, replica)

    def stacks(self, timeout: float = 10, *, locals: bool = False) -> tuple[ProcessStacks, ...]:
        """The live stacks of each running replica and of the job's running descendants (its tasks' executors).

        The controller asks each worker that runs one, and the worker its task processes; a
        worker or process that does not answer within ``timeout`` s is reported with ``error``.
        """
        return tuple(self._controller.job_stacks(self._job_id, float(timeout), bool(locals)))

    def logs(self, max_lines: int | None = None) -> tuple[str, ...]:
        """The job's output lines, all replicas and attempts, in arrival order (see :func:`log_tail`)."""
        log_tail((), max_lines)  # refuses a bad max_lines as every backend does
        return tuple(line for _, line in self._controller.logs(self._job_id, max_lines or None))

    def pending_reason(self) -> str:
        """Why the job is not running yet ("" once it runs)."""
        return self.view().pending_reason

    def info(self) -> JobSummary:
        """The job's status and, while it is PENDING, the scheduler's reason (see :class:`~fray.job.JobSummary`)."""
        return _summary(self.view())


def _summary(view: JobView) -> JobSummary:
    status = _settled_status(view)
    return JobSummary(view.job_id, status, view.pending_reason if status == JobStatus.PENDING else "")


def send_queued_submits() -> None:
    """Wait until every ClusterClient of this process has sent the submits it queued (see ``_submit_batch``)."""
    for client in list(live_clients):
        client._batcher.flush()


class ClusterClient(ClientCore["ClusterJobHandle", "ClusterActorHandle"]):
    """A client of the Fray cluster whose controller is at ``address`` (``host:port``).

    ``token`` is a :class:`~fray.cluster.protocol.credentials.Credential` or the cluster token;
    by default ``FRAY_CREDENTIAL``, ``FRAY_TOKEN``, ``~/.config/fray/credential`` or
    ``~/.config/fray/token``. A user credential identifies the user (``user`` is then
    ignored by the controller); the cluster token may act for any ``user``. Inside a
    cluster job the client submits child jobs of that job, in its namespace. Actors it
    created are stopped when the process exits (or at :meth:`shutdown`); jobs keep running
    unless submitted with ``detached=False`` (see :mod:`fray.core._driver_exit`).

    Every :class:`~fray.actor_config.ActorConfig` field is honoured: ``max_concurrency``
    by the actor's RPC server, restarts as retries of the actor's job (its preemption
    budget is ``max_restarts``), ``max_task_retries`` by the handles, and a detached
    actor is left running at :meth:`shutdown` and at exit. An actor's handle works at
    once; its calls wait until it serves.

    Of marin's job settings it honours ``processes_per_task`` (each task runs that many
    processes under :mod:`fray.process._ranks`) and ``EnvironmentConfig.extras`` (what the
    workspace project's extras or dependency groups bring is installed into the job's
    environment); :meth:`submit_many` refuses the others as :meth:`submit` does.
    """

    BACKEND = "Fray cluster"
    CONTEXT_FIRST = True  # its executors are jobs of this client that serve until told
    HONOURS = frozenset(
        {"JobRequest.processes_per_task", "JobRequest.priority", "JobRequest.timeout", "EnvironmentConfig.extras"}
    )

    def __init__(
        self, address: str, *, token: CredentialLike = None, namespace: str | None = None, user: str | None = None
    ) -> None:
        super().__init__()
        self.address = address
        self._token = resolve_credential(token)
        self._controller = connect_controller(address, self._token)
        self.user = user or os.environ.get("FRAY_USER") or getpass.getuser()
        inside = os.environ.get("FRAY_CLIENT_SPEC", "") == f"fray://{address}" and bool(os.environ.get("FRAY_JOB_ID"))
        self._parent = os.environ["FRAY_JOB_ID"] if inside else None
        if inside:  # a task of this cluster: blocked on its own work, it lends its CPU (fray.core._lending)
            lend_through(self._controller)
        # One namespace rule for jobs and actors (fray.cluster.rpc.namespace): refused here, not when an actor starts.
        self.namespace = resolve_namespace(
            namespace or (os.environ.get("FRAY_NAMESPACE") if inside else None) or f"{self.user}-{uuid.uuid4().hex[:8]}"
        )
        self._owned: list[tuple[str, bool, bool]] = []  # (job id, is actor, detached)
        self._batcher = SubmitBatcher(self._send_batch, self._own_batch)
        self._submitted = False  # True once a submit was answered (see _start_job)
        live_clients.add(self)

    @classmethod
    def from_spec(cls, spec: ClientSpec) -> ClusterClient:
        """Build from ``fray://host:port[?namespace=NAME&user=NAME]``."""
        if spec.address is None:
            raise spec.invalid("fray:// needs the controller's HOST:PORT")
        options = spec.only("fray://", "namespace", "user")
        return cls(spec.address, namespace=options.get("namespace"), user=options.get("user"))

    def __repr__(self) -> str:
        return f"ClusterClient({self.address!r}, namespace={self.namespace!r})"

    def _submit(self, spec: JobSpec, is_actor: bool, detached: bool = True) -> ClusterJobHandle:
        if self._closed:
            raise self._shut_down()
        view: JobView = self._controller.submit(spec, user=self.user, parent_id=self._parent, namespace=self.namespace)
        with self._lock:
            self._owned.append((view.job_id, is_actor, detached))
        return ClusterJobHandle(self.address, view.job_id, self._token)

    def _start_jobs(self, requests: list[JobRequest], detached: bool) -> list[ClusterJobHandle]:
        # A few controller round trips, one transaction per batch (each recorded whole or not at all).
        self._batcher.flush()  # plain submits made before these are recorded before them
        specs = [self._spec(request) for request in requests]
        handles: list[ClusterJobHandle] = []
        for batch in batches(specs):
            views = self._send_batch(batch)
            self._own_batch(views, [detached] * len(views))
            handles.extend(ClusterJobHandle(self.address, view.job_id, self._token) for view in views)
        return handles

    def _start_job(self, request: JobRequest, detached: bool) -> ClusterJobHandle:
        # Checked and shipped here, so a bad request is refused at once; recorded by the
        # batcher with whatever else this client submits meanwhile (one round trip for all).
        spec = self._spec(request)
        if not self._submitted:
            # The first submit waits for its answer: a wrong credential or an address with no
            # controller is refused by the submit itself, not later by the handle.
            handle = self._submit(spec, is_actor=False, detached=detached)
            self._submitted = True
            return handle
        with self._lock:
            if self._closed:
                raise self._shut_down()
            future = self._batcher.add(spec, detached)
        return ClusterJobHandle(self.address, future, self._token)

    def _spec(self, request: JobRequest) -> JobSpec:
        check_processes(request)
        placed_spec = JobSpec.from_request(placed_request(request, self._alive_workers))
        # Imported here: only a job with a workspace or packages needs it (and pathspec with it).
        from fray.cluster.server.envs._shipping import ship_environment

        return ship_environment(placed_spec, self.address, self._token, self._controller)

    def _send_batch(self, specs: list[JobSpec]) -> list[JobView]:
        views: list[JobView] = self._controller.submit_many(
            specs, user=self.user, parent_id=self._parent, namespace=self.namespace
        )
        return views

    def _own_batch(self, views: list[JobView], detached: list[bool]) -> None:
        with self._lock:
            self._owned.extend((view.job_id, False, d) for view, d in zip(views, detached, strict=True))

    def _live_job(self, request: JobRequest) -> ClusterJobHandle | None:
        """The oldest PENDING or RUNNING job named as ``request`` in this client's namespace, as the controller sees it."""
        self._batcher.flush()  # this client's own submits so far count
        views = self._controller.list_jobs([JobStatus.PENDING.value, JobStatus.RUNNING.value])
        for view in views:
            if view.name == request.name and view.namespace == self.namespace:
                return ClusterJobHandle(self.address, view.job_id, self._token)
        return None

    def _create_actor(self, start: ActorStart) -> tuple[ClusterActorHandle, ClusterJobHandle]:
        name, config = start.name, start.config
        reserved, env = placed(start.resources, self._alive_workers)
        make_handle = functools.partial(
            ClusterActorHandle,
            self.address,
            self.namespace,
            name,
            cls=start.actor_class,
            max_task_retries=config.max_task_retries,
        )
        options: dict[str, Any] = {"max_concurrency": config.max_concurrency, "handle": make_handle}
        if start.group is not None:
            options.update(group=start.group[0], index=start.group[1])
        hosted = (start.actor_class, start.args, start.kwargs, name, options)
        request = JobRequest(
            name=name,
            entrypoint=Entrypoint.from_callable(host_actor, args=hosted),
            resources=reserved,
            environment=EnvironmentConfig(env_vars=env),
            # A restart is a retry of the actor's job after its process was lost; a constructor
            # that raises, or an actor that fails itself, is final.
            max_retries_preemption=config.max_restarts,
            priority=config.priority,
        )
        spec = JobSpec.from_request(request, actor_name=name, command=f"actor {start.actor_class.__qualname__}")
        job = self._submit(spec, is_actor=True, detached=config.detached)
        handle = make_handle(job_id=job.job_id, token=self._token)
        handle._fray_ready()
        return handle, job

    def timeline(self, job: str | JobHandle | None = None, since: float | None = None) -> dict[str, Any]:
        """The cluster's jobs as a Chrome trace (see :mod:`fray.cluster.server.trace`), as ``fray timeline`` writes.

        ``job`` keeps one job (a handle, an id, or a name: the newest job of that name); ``since`` keeps
        the jobs running in the last ``since`` seconds. A user's credential sees only that user's jobs.
        """
        if since is not None and (isinstance(since, bool) or not isinstance(since, (int, float)) or since < 0):
            raise ConfigError(f"timeline(since={since!r}): give a number of seconds >= 0, or None for all")
        ops = ops_client(self.address, self._token)
        try:
            job_id = None
            if isinstance(job, JobHandle):
                job_id = job.job_id
            elif job is not None:
                found = ops.find_jobs(job)
                if not found:
                    raise NotFound(f"timeline(job={job!r}): no job of that id or name on the cluster at {self.address}")
                job_id = found[0]
            return ops.timeline(job_id, None if since is None else time.time() - since)
        finally:
            ops.close()

    def _alive_workers(self) -> list[WorkerInfo]:
        return [w.info for w in self._controller.list_workers() if w.state == "alive"]

    # ----- the job level -------------------------------------------------------------------------

    def _make_job_context(self) -> ClusterJobContext:
        """The job context inside this client's jobs: tasks on executor jobs."""
        return ClusterJobContext(self)

    # ----- queues ------------------------------------------------------------------------------

    def _open_queue(self, name: str, exist_ok: bool) -> ClusterQueue[Any]:
        """A durable queue with leases in the controller, named ``name`` in this client's namespace.

        ``exist_ok`` attaches to the namespace's queue of that name (a job of this client's
        namespace does so to reach its submitter's queue). See :mod:`fray.cluster.client.queue`.
        """
        key = f"{self.namespace}/{name}"
        self._controller.queue("create", key, exist_ok, uuid.uuid4().hex, self.user)
        return ClusterQueue(self.address, key, name, self._token)

    def _owned_work(self) -> tuple[list[ClusterJobHandle], list[ClusterJobHandle]]:
        self._batcher.flush()  # what was submitted before is recorded, and owned: waited for or stopped
        with self._lock:
            owned = list(self._owned)
        handle = functools.partial(ClusterJobHandle, self.address, token=self._token)
        jobs = [handle(job_id) for job_id, is_actor, _ in owned if not is_actor]
        # A detached actor outlives this client (ActorConfig(lifetime="detached")).
        return jobs, [handle(job_id) for job_id, is_actor, detached in owned if is_actor and not detached]

    def _exit_notice(self) -> ExitNotice | None:
        if self._parent is not None:
            return None  # inside a job: its children end with it, and its log is no place for CLI advice
        return ExitNotice(
            f"the Fray cluster at {self.address}",
            list_hint=f"list them: fray job list --namespace {self.namespace}",
            stop_hint=f"stop them: fray job stop --namespace {self.namespace}",
        )

    def _leftovers_at_exit(self) -> Leftovers:
        return _leftovers_at_exit(self)

    def _end(self, handles: Sequence[ClusterJobHandle], wait: bool) -> None:
        super()._end(handles, wait)
        if not wait:  # returns once the stopped processes are gone, so that no later call reaches one
            deadline = time.monotonic() + _STOP_SECONDS
            for handle in handles:
                with contextlib.suppress(FrayError, TimeoutError):
                    handle.wait(max(0.0, deadline - time.monotonic()), raise_on_failure=False)


def _leftovers_at_exit(client: ClusterClient) -> Leftovers:
    """In bulk and bounded (2 s a controller call): one look at the jobs, then a stop of each attached one."""
    client._batcher.flush(_EXIT_SECONDS)
    with client._lock:
        owned = list(client._owned)
    leftovers = Leftovers()
    if not owned:
        return leftovers
    rpc = client._controller.bounded(_EXIT_SECONDS)
    try:
        jobs = [job_id for job_id, is_actor, _ in owned if not is_actor]
        live = {v.job_id for v in rpc.wait(jobs, 0.0) if not v.state.finished} if jobs else set()
        for job_id, is_actor, detached in owned:
            if not detached:  # attached jobs, and actors unless created detached
                with contextlib.suppress(FrayError, OSError):
                    rpc.terminate(job_id, "its script exited")
                if not is_actor and job_id in live:
                    leftovers.stopped.append(job_id)
            elif job_id in live:
                leftovers.kept.append(job_id)
    except (FrayError, OSError):
        return Leftovers()  # the controller is gone: there is nothing left to stop or to report
    return leftovers
