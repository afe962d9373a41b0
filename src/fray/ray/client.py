"""The Ray backend's client: :class:`RayClient`.

How Fray concepts map onto Ray (each in its own module):

* a callable job (``jobs.py``) is one Ray task per replica; replicas of one job are
  gang-scheduled in a placement group (all start or none), and Fray runs the retry
  loop itself;
* a binary job (``binary.py``) is a Ray job (``JobSubmissionClient``) with the
  entrypoint resources and a runtime env carrying env vars, working dir and pip packages;
* a TPU job (``tpu.py``) is a callable job placed on whole TPU slices;
* an actor (``actors.py``) is a named Ray actor in the client's namespace, hosted by an
  actor job (``jobs.py``).

Ray's connection is process-global (``_connection.py``): ``ray.init`` may run once per
process and every ``RayClient`` of the process shares it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from fray.client import ClientSpec
from fray.core._client_core import ActorStart, ClientCore
from fray.core._driver_exit import ExitNotice
from fray.errors import ConfigError, FrayError
from fray.job import CallableEntrypoint, JobRequest, validate_name
from fray.ray._actor_start import start_actor
from fray.ray._connection import CONNECTION
from fray.ray._launch import Launcher
from fray.ray._shipping import Shipping
from fray.ray.actors import RayActorHandle, disown, own
from fray.ray.binary import BinaryJob
from fray.ray.context import RayJobContext, context_for
from fray.ray.jobs import ActorJob, CallableJob, RayJobHandle
from fray.ray.queue import RayQueue, create_queue
from fray.ray.resources import choose_device
from fray.ray.tpu import TpuJob
from fray.resources import ResourceConfig, TpuConfig

__all__ = ["RayClient"]

_NOTICE = ExitNotice(
    "Ray",
    list_hint="list them: ray job list",
    stop_hint="stop one: ray job stop fray-<job id>-a<attempt>-r<replica>",
    why_ended="callable jobs are Ray tasks of this script's driver",
)

# Every live RayClient of this process by namespace, so that an unpickled client is the live one.
_CLIENTS: weakref.WeakValueDictionary[str, RayClient] = weakref.WeakValueDictionary()


class RayClient(ClientCore["RayJobHandle", "RayActorHandle"]):
    """Runs Fray jobs and actors on a Ray cluster.

    ``address`` is what ``ray.init`` takes: None connects to the running cluster (from
    ``RAY_ADDRESS`` or the latest ``ray start`` on this machine) or starts a local one,
    ``"auto"`` requires a running cluster, ``"ray://host:port"`` uses Ray Client.
    ``namespace`` scopes actor names; it defaults to the namespace of the Ray
    connection. ``ray_init_kwargs`` are passed to ``ray.init`` when this client makes
    the connection.

    Ray allows one connection per process. The first RayClient that finds Ray
    unconnected calls ``ray.init`` and the connection lives until the last RayClient of
    the process shuts down; a process that called ``ray.init`` itself keeps control of
    its connection (Fray never shuts it down). Several RayClients may share the
    connection with different namespaces: each puts its actors into its own namespace
    (Ray's per-actor ``namespace`` option), while tasks, which have no namespace in Ray,
    simply run on the shared cluster.

    Binary jobs outlive the script unless submitted with ``detached=False``; callable jobs
    are Ray tasks of this driver and end with it (see :mod:`fray.core._driver_exit`).
    Every :class:`~fray.actor_config.ActorConfig` field maps onto Ray's own actor option of
    the same name (``lifetime="detached"`` onto Ray's detached lifetime); Ray restarts the
    actor and retries its calls itself. Actors are named Ray actors in the client's namespace.
    """

    BACKEND = "Ray"
    HONOURS = frozenset({"JobRequest.priority", "JobRequest.timeout"})

    def __init__(
        self,
        address: str | None = None,
        *,
        namespace: str | None = None,
        ray_init_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        import ray

        super().__init__()
        if namespace is not None:
            validate_name(namespace, "Ray namespace")
        CONNECTION.acquire(address, namespace, dict(ray_init_kwargs or {}))
        self.address = address
        self.namespace: str = namespace or ray.get_runtime_context().namespace
        self.spec = f"ray?namespace={quote(self.namespace)}"
        self._launcher = Launcher(address, self.namespace, self.spec)
        # Weak: a finished job the caller dropped must not be kept forever. Running jobs stay
        # alive through whoever drives them (the reaper, a binary job's watcher thread).
        self._jobs: weakref.WeakValueDictionary[str, RayJobHandle] = weakref.WeakValueDictionary()
        self._actor_jobs: dict[str, ActorJob] = {}
        self._queues: list[RayQueue[Any]] = []
        self._shipping = Shipping()
        _CLIENTS.setdefault(self.namespace, self)

    @classmethod
    def from_spec(cls, spec: ClientSpec) -> RayClient:
        """Build from ``ray``, ``ray?namespace=NAME`` or ``ray://HOST:PORT[?namespace=NAME]``."""
        namespace = spec.only("ray", "namespace").get("namespace") or None
        if namespace is not None:
            try:
                validate_name(namespace, "Ray namespace")
            except ConfigError as exc:
                raise spec.invalid(str(exc)) from None
        address = f"ray://{spec.address}" if spec.address else None
        return cls(address, namespace=namespace)

    @classmethod
    def _attach(cls, namespace: str) -> RayClient:
        """The client of this process for ``namespace`` (used when a client is unpickled)."""
        client = _CLIENTS.get(namespace)
        return client if client is not None else cls(namespace=namespace)

    def __reduce__(self) -> tuple[object, ...]:
        return (RayClient._attach, (self.namespace,))

    def __repr__(self) -> str:
        return f"RayClient(address={self.address!r}, namespace={self.namespace!r})"

    # ----- jobs -------------------------------------------------------------------------------

    def _register(self, job: RayJobHandle) -> None:
        with self._lock:
            self._check_open()
            self._jobs[job.job_id] = job

    def _start_job(self, request: JobRequest, detached: bool) -> RayJobHandle:
        return self._submit(request)

    def _known_finished(self, job: RayJobHandle) -> bool:
        return job._lifecycle.finished

    def _exit_notice(self) -> ExitNotice:
        return _NOTICE

    def _outlives_script(self, job: RayJobHandle) -> bool:
        # Callable jobs are Ray tasks owned by this driver, which Ray ends with it; binary jobs go
        # through Ray's job API and outlive it.
        return isinstance(job, BinaryJob)

    def _submit(self, request: JobRequest) -> RayJobHandle:
        placed = self._placed(request.resources)
        if placed is not request.resources:  # a copy checks the whole request again: only when a device was chosen
            request = dataclasses.replace(request, resources=placed)
        job_id = self._child_job_id(request.name)
        if isinstance(request.resources.device, TpuConfig) or isinstance(request.entrypoint, CallableEntrypoint):
            kind = TpuJob if isinstance(request.resources.device, TpuConfig) else CallableJob
            job = kind(self._launcher, job_id, request, self._shipping.entry(request))
            self._register(job)
            job._launch()
            return job
        binary = BinaryJob(self._launcher, job_id, request)
        self._register(binary)
        try:
            binary.start()
        except Exception as exc:
            with self._lock:
                self._jobs.pop(job_id, None)
            raise FrayError(f"job {request.name!r}: Ray's job API refused it: {exc}") from exc
        return binary

    def _placed(self, resources: ResourceConfig) -> ResourceConfig:
        """``resources`` for the one device chosen among its alternatives (itself without alternatives)."""
        if not resources.device_alternatives:
            return resources
        import ray

        return resources.with_device(choose_device(resources, ray.cluster_resources()))

    # ----- actors -----------------------------------------------------------------------------

    def _create_actor(self, start: ActorStart) -> tuple[RayActorHandle, ActorJob]:
        job_id = self._child_job_id(start.name)
        handle = start_actor(start, self._placed(start.resources), job_id, self._launcher, self._shipping, self.spec)
        job = ActorJob(
            job_id,
            handle,
            on_terminate=self._forget_actor,
            max_restarts=start.config.max_restarts,
            detached=start.config.detached,
        )
        with self._lock:
            self._jobs[job_id] = job
            self._actor_jobs[job_id] = job
        own(handle)
        return handle, job

    def _forget_actor(self, job_id: str) -> None:
        with self._lock:
            job = self._actor_jobs.pop(job_id, None)
        if job is not None:
            disown(job._handle)

    # ----- the job level ----------------------------------------------------------------------

    def _make_job_context(self) -> RayJobContext:
        """This client's job context (``fray.get_job_context()`` inside its jobs): Ray tasks and objects."""
        return context_for(self.namespace, self)

    def _open_queue(self, name: str, exist_ok: bool) -> RayQueue[Any]:
        """A queue with leases kept by a Ray actor of this client (see :mod:`fray.ray.queue`).

        ``exist_ok`` attaches to the namespace's queue of that name if there is one.
        """
        queue, created = create_queue(name, self.namespace, exist_ok=exist_ok)
        if created:  # ends with this client, like its actors; an attached queue is its creator's
            with self._lock:
                self._queues.append(queue)
        return queue

    # ----- lifecycle --------------------------------------------------------------------------

    def _owned_work(self) -> tuple[list[RayJobHandle], list[ActorJob]]:
        with self._lock:
            jobs = [j for j in self._jobs.values() if not isinstance(j, ActorJob)]
            return jobs, [job for job in self._actor_jobs.values() if not job.detached]

    def _release(self) -> None:
        """Kill the queues this client made; disconnect from Ray when this was the last RayClient and Fray connected."""
        with self._lock:
            queues, self._queues = self._queues, []
        for queue in queues:
            with contextlib.suppress(Exception):  # attached to a queue someone else already ended
                queue._kill()
        self._launcher.shutdown()
        if _CLIENTS.get(self.namespace) is self:
            del _CLIENTS[self.namespace]
        CONNECTION.release()
