"""Fray's :class:`~fray.client.Client` on an Iris cluster, wrapping Iris's own client (``iris.client.IrisClient``).

Jobs are Iris jobs (one task per replica, gang-submitted as Iris ``replicas``), actors
are Iris jobs serving with Iris's actor server (``fray.iris.actor``), and everything
about a job after submit -- status, retries, logs, cancel -- is Iris's. This module
only translates: ``fray.iris.mapping`` holds the field-by-field table.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from iris.client import JobAlreadyExists as IrisJobAlreadyExists
from iris.cluster.types import Entrypoint as IrisEntrypoint

from fray._client_core import ClientCore
from fray._codepickle import dumps
from fray._driver_exit import ExitNotice, JobsAtExit
from fray._local_context import LocalJobContext
from fray._serialization import call_parts, check_picklable
from fray.actor import check_actor_request
from fray.actor_config import ActorConfig, check_actor_config_supported
from fray.errors import ConfigError, FrayError, JobAlreadyExists, SerializationError
from fray.iris import _connect, _task
from fray.iris.actor import IrisActorHandle, host_actor
from fray.iris.job import IrisJobHandle, JobMeta, forget_terminated
from fray.iris.mapping import environment_spec, placement
from fray.job import (
    CallableEntrypoint,
    EnvironmentConfig,
    JobInfo,
    JobRequest,
    replica_env,
)
from fray.resources import ResourceConfig

if TYPE_CHECKING:
    from iris.client import IrisClient as IrisLib

    from fray.client import ClientSpec

__all__ = ["IN_TASK_SPEC", "IrisClient"]

#: The spec jobs get in ``FRAY_CLIENT_SPEC``: "the Iris cluster this task runs in", found
#: from the task's Iris context (the controller address seen from inside the cluster may
#: differ from the one the submitter used).
IN_TASK_SPEC = "iris"

_live_clients: weakref.WeakSet[IrisClient] = weakref.WeakSet()
_AT_EXIT = JobsAtExit()


# The ActorConfig fields this backend honours: Iris runs every actor as one job, never restarted by Fray.
_ACTOR_CONFIG = frozenset({"max_concurrency", "lifetime"})


@atexit.register
def _release_actors_at_exit() -> None:
    # A driver's actors serve only that driver: stop them when it exits, as the other
    # backends do. Inside an Iris task Iris does this itself (child jobs end with their parent).
    for client in list(_live_clients):
        client._terminate_owned(actors_only=True)


class IrisClient(ClientCore["IrisJobHandle", "IrisActorHandle"]):
    """A Fray client of the Iris cluster whose controller is at ``address`` (``HOST:PORT``).

    ``address=None`` means the cluster the calling Iris task runs in (what
    ``current_client()`` picks inside a task). ``workspace`` is a directory Iris bundles
    and ships to the workers with every job (Iris's ``IrisClient.remote(workspace=...)``).
    Inside a task, jobs and actors are children of the task's job, in its namespace.

    A job outlives the script unless submitted with ``detached=False``, which stops it
    when the script exits (the driver-exit rule, :mod:`fray._driver_exit`); inside an
    Iris task, jobs are children of the task's job and end with it. Actors are Iris jobs;
    of :class:`~fray.actor_config.ActorConfig`, ``max_concurrency`` (Iris's actor server
    threads) and ``lifetime`` are honoured, restarts and call retries are refused by name.
    Queues are refused (no queue with leases of its own yet): keep one in an actor with
    ``fray.queue.actor_queue(client, name)``.
    """

    BACKEND = "Iris"

    def __init__(self, address: str | None = None, *, workspace: str | None = None) -> None:
        super().__init__()
        in_task = _connect.in_task()
        if address is None and not in_task:
            raise ConfigError(
                "IrisClient() without an address works only inside an Iris task; "
                "elsewhere give the controller's HOST:PORT (FRAY_CLIENT_SPEC=iris://HOST:PORT)"
            )
        self.address: str | None = address or _connect.task_controller()
        self.workspace = str(Path(workspace).resolve()) if workspace else None
        self._in_task = in_task
        if self.workspace is None:
            self._iris: IrisLib = _connect.iris_client(address)
        else:
            from iris.client import IrisClient as IrisLib

            self._iris = IrisLib.remote(_connect.controller_url(self.address or ""), workspace=Path(self.workspace))
        self._owned: list[tuple[IrisJobHandle, bool]] = []  # (job, is an actor)
        _live_clients.add(self)

    @classmethod
    def from_spec(cls, spec: ClientSpec) -> IrisClient:
        """Build from ``iris://HOST:PORT[?workspace=PATH]``, or ``iris`` inside an Iris task."""
        unknown = set(spec.options) - {"workspace"}
        if unknown:
            raise spec.invalid(f"unknown option(s) {sorted(unknown)} for iris://")
        if spec.address is None and not _connect.in_task():
            raise spec.invalid("'iris' names the Iris cluster of the task it runs in; outside one use iris://HOST:PORT")
        return cls(spec.address, workspace=spec.options.get("workspace") or None)

    def __repr__(self) -> str:
        return f"IrisClient({self.address!r})"

    @property
    def iris(self) -> IrisLib:
        """The wrapped ``iris.client.IrisClient``."""
        return self._iris

    # ----- jobs ---------------------------------------------------------------------------------------

    def _start_job(self, request: JobRequest, detached: bool) -> IrisJobHandle:
        entry = request.entrypoint
        if isinstance(entry, CallableEntrypoint):
            payload = _pickled(f"job {request.name!r}", entry.callable, entry.args, dict(entry.kwargs))
            entrypoint = IrisEntrypoint.from_callable(_task.run_callable, payload)
        else:
            entrypoint = IrisEntrypoint.from_command(*_task.binary_command(entry.argv))
        handle = self._launch(request, entrypoint, _label(request), binary=not isinstance(entry, CallableEntrypoint))
        if not self._in_task:  # inside a task Iris ends its children with it, and its log is no place for advice
            notice = ExitNotice(f"the Iris cluster at {self.address}")
            _AT_EXIT.track(handle, notice, detached=detached, outlives_driver=True)
        return handle

    def _launch(
        self,
        request: JobRequest,
        entrypoint: IrisEntrypoint,
        label: str,
        *,
        binary: bool,
        ports: list[str] | None = None,
        detached: bool = False,
    ) -> IrisJobHandle:
        if self._closed:
            raise self._shut_down()
        place = placement(request.resources, request.replicas)
        env_cfg = request.environment or EnvironmentConfig()
        info = JobInfo(job_id="", name=request.name, replica_count=request.replicas)
        env = replica_env(info, IN_TASK_SPEC, env_cfg.env_vars)
        env[_task.HOSTS_ENV] = str(place.hosts_per_replica)
        environment, image = environment_spec(env_cfg, env, workspace=self.workspace, in_task=self._in_task)
        try:
            job = self._iris.submit(
                entrypoint,
                request.name,
                place.resources,
                environment=environment,
                ports=ports,
                # None, not []: inside a task an empty list would drop the parent's constraints.
                constraints=place.constraints or None,
                coscheduling=place.coscheduling,
                replicas=place.replicas,
                max_retries_failure=request.max_retries_failure,
                max_retries_preemption=request.max_retries_preemption,
                # Fray's failure budget is per job; Iris's job-wide allowance of failed attempts matches it.
                max_task_failures=request.max_retries_failure,
                task_image=image,
            )
        except IrisJobAlreadyExists as exc:
            raise JobAlreadyExists(
                f"{request.name!r}: an Iris job with this name is still live here ({exc}); "
                "Iris names are unique among live jobs: pick another name or terminate it first"
            ) from exc
        except ConnectError as exc:
            if exc.code in (Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION, Code.OUT_OF_RANGE):
                raise ConfigError(f"Iris refused job {request.name!r}: {exc.message}") from exc
            raise FrayError(f"Iris did not accept job {request.name!r}: {exc.code.name}: {exc.message}") from exc
        except ValueError as exc:
            raise ConfigError(f"Iris refused job {request.name!r}: {exc}") from exc
        job_id = job.job_id.to_wire()
        forget_terminated(job_id)
        handle = IrisJobHandle(job_id, _meta(request, label, binary), self.address, self._iris)
        with self._lock:
            if not detached:  # a detached actor outlives this client: nothing here stops it
                self._owned.append((handle, ports is not None))
        return handle

    def _live_job(self, request: JobRequest) -> IrisJobHandle | None:
        """The live Iris job a submit of ``request`` from here would clash with, if any.

        Iris names are unique among live jobs: a top-level job named ``x`` is
        ``/{user}/x`` (Iris's own rule for the user), one submitted inside a task is a child
        of the task's job. What the handle must know of the job (its command, replicas,
        budgets) is taken from ``request``, which names the same job.
        """
        from iris.cluster.client.job_info import get_job_info, resolve_job_user
        from iris.cluster.types import JobName

        info = get_job_info() if self._in_task else None
        wanted = info.job_id.child(request.name) if info is not None else JobName.root(resolve_job_user(), request.name)
        wire = wanted.to_wire()
        if wire not in {name.to_wire() for name in self._iris.active_job_names_for_prefix(wire)}:
            return None
        binary = not isinstance(request.entrypoint, CallableEntrypoint)
        return IrisJobHandle(wire, _meta(request, _label(request), binary), self.address, self._iris)

    # ----- actors -------------------------------------------------------------------------------------

    def _create_actor(
        self,
        actor_class: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
        resources: ResourceConfig | None,
        actor_config: ActorConfig | None,
        group: tuple[str, int] | None,
    ) -> tuple[IrisActorHandle, IrisJobHandle]:
        reserved, config = check_actor_request(actor_class, name, resources, args, kwargs, actor_config)
        check_actor_config_supported("Iris", config, _ACTOR_CONFIG)
        payload = _pickled(f"actor {name!r}", actor_class, args, kwargs, "the class")
        options: dict[str, Any] = {"max_concurrency": config.max_concurrency, "address": self.address}
        if group is not None:
            options.update(group=group[0], index=group[1])
        request = JobRequest(
            name=name,
            entrypoint=CallableEntrypoint(host_actor, (payload, name, options)),
            resources=reserved,
        )
        entrypoint = IrisEntrypoint.from_callable(host_actor, payload, name, options)
        job = self._launch(
            request, entrypoint, actor_class.__qualname__, binary=False, ports=["actor"], detached=config.detached
        )
        return IrisActorHandle(name, job, actor_class, self.address, self._iris, config.max_concurrency), job

    # ----- the job level ------------------------------------------------------------------------------

    def _make_job_context(self) -> LocalJobContext:
        """The job context inside an Iris job: tasks on threads of the job's process."""
        return LocalJobContext(client=self)

    # ----- shutdown -----------------------------------------------------------------------------------

    def _terminate_owned(self, *, actors_only: bool) -> None:
        """Best effort: terminate this client's actors (and its jobs unless ``actors_only``)."""
        with self._lock:
            owned = [job for job, is_actor in self._owned if is_actor or not actors_only]
        for job in owned:
            with contextlib.suppress(Exception):  # a controller that went away has nothing left to stop
                job.terminate()

    def shutdown(self, wait: bool = True) -> None:
        """Stop this client's actors (and, unless ``wait``, its running jobs); refuse new work."""
        self._closed = True
        with self._lock:
            owned = list(self._owned)
        for job, is_actor in owned:
            with contextlib.suppress(Exception):
                if wait and not is_actor:
                    job.wait(raise_on_failure=False)
                else:
                    job.terminate()
        _live_clients.discard(self)


def _label(request: JobRequest) -> str:
    """What the job runs, for its failure's wording: the command, or the callable's qualified name."""
    entry = request.entrypoint
    if isinstance(entry, CallableEntrypoint):
        return getattr(entry.callable, "__qualname__", None) or repr(entry.callable)
    return entry.command


def _meta(request: JobRequest, label: str, binary: bool) -> JobMeta:
    return JobMeta(
        name=request.name,
        label=label,
        binary=binary,
        replicas=request.replicas,
        hosts_per_replica=placement(request.resources, request.replicas).hosts_per_replica,
        max_retries_failure=request.max_retries_failure,
        max_retries_preemption=request.max_retries_preemption,
    )


def _pickled(what: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], label: str = "the callable") -> bytes:
    """``(fn, args, kwargs)`` cloudpickled; a piece that cannot be is named in a SerializationError."""
    try:
        return dumps((fn, args, kwargs))
    except Exception as exc:
        check_picklable(what, call_parts(fn, args, kwargs, label))
        raise SerializationError(f"{what}: cannot be pickled ({type(exc).__name__}: {exc})") from exc
