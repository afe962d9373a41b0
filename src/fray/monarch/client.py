"""``MonarchClient``: the :class:`~fray.client.Client` protocol on PyTorch Monarch (spec ``monarch``).

Jobs are processes on this host driven from the client (:mod:`fray.monarch.jobs`);
actors are Monarch actors, each on a process of a Monarch process mesh
(:mod:`fray.monarch.actors`); a group's members are the ranks of one mesh. The
mapping, its limits and the supervision settings are described in ``docs/monarch.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from fray.client import ClientSpec
from fray.cluster.server.envs._project import check_extras
from fray.core._client_core import ActorStart, ClientCore, check_count, check_installed, short_id
from fray.core._driver_exit import ExitNotice
from fray.core._owned import OwnedWork
from fray.core._serialization import call_parts, check_picklable
from fray.errors import ConfigError, JobAlreadyExists
from fray.job import CallableEntrypoint, EnvironmentConfig, JobRequest, current_job
from fray.monarch import supervision
from fray.monarch._spawn import spawn_mesh
from fray.monarch.actors import ActorRecord, HostMesh, MonarchActorHandle
from fray.monarch.context import MonarchJobContext
from fray.monarch.jobs import MonarchJob, MonarchJobHandle
from fray.process._ranks import check_processes
from fray.queue import ActorQueue, actor_queue
from fray.resources import CpuConfig, ResourceConfig

__all__ = ["MonarchClient"]

_REQ_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


_NOTICE = ExitNotice("Monarch", why_ended="Monarch jobs are processes of this script's host")


def _check_resources(what: str, resources: ResourceConfig) -> ResourceConfig:
    """Refuse, by name, the resource fields the Monarch backend cannot honour on one host; the CPU placement."""
    if resources.placement_regions is not None:
        raise ConfigError(
            f"{what}: ResourceConfig(regions={list(resources.regions or ())!r}) cannot be honoured by the Monarch backend, "
            "which runs everything on this host; drop regions, or use the Ray or Fray cluster backend"
        )
    if resources.zone is not None:
        raise ConfigError(
            f"{what}: ResourceConfig(zone={resources.zone!r}) cannot be honoured by the Monarch backend, which runs "
            "everything on this host; drop zone, or use the Ray or Fray cluster backend"
        )
    if any(isinstance(d, CpuConfig) for d in resources.device_choices):
        return resources.with_device(CpuConfig())  # among the alternatives, the one this host has
    if not isinstance(resources.device, CpuConfig):
        raise ConfigError(
            f"{what}: ResourceConfig(device={resources.device!r}) is not supported by the Monarch backend yet "
            "(it places processes on this host's CPUs); use the Ray or Fray cluster backend for accelerators"
        )
    return resources


def _check_environment(name: str, environment: EnvironmentConfig) -> None:
    if environment.docker_image:
        raise ConfigError(
            f"job {name!r}: EnvironmentConfig(docker_image={environment.docker_image!r}) is not supported by the "
            "Monarch backend, which runs jobs as processes on this host; drop docker_image or use another backend"
        )
    check_installed(name, environment.pip_packages, "Monarch")
    check_extras(name, environment, "Monarch")  # jobs run in this Python environment, as on the local backend


class MonarchClient(ClientCore["MonarchJobHandle", "MonarchActorHandle"]):
    """Jobs as processes on this host, actors as Monarch actors on process meshes.

    ``procs`` (spec ``monarch?procs=N``) is the size of the pool of pre-spawned worker
    processes that tasks will run on (the job-level API; see ``docs/monarch.md``).
    Limits: everything runs on this host; ``cpu``, ``ram`` and ``disk`` are not
    enforced; accelerators and ``regions`` are refused; ``docker_image`` is refused and
    ``pip_packages`` must already be installed; job handles work in this process only.
    ``JobRequest.processes_per_task`` runs that many processes in each replica
    (:mod:`fray.process._ranks`, as on the local backend and ``fray://``).

    A job's processes are the script's own children, so its jobs end with it whatever
    ``detached`` says (the driver-exit rule, :mod:`fray.core._driver_exit`); at exit, Fray names
    the ones that were still running. An actor runs on a new Monarch process (a group on
    one process mesh); of :class:`~fray.actor_config.ActorConfig`, ``max_concurrency`` is
    honoured, restarts, call retries and a detached lifetime are refused by name (see
    ``docs/monarch.md``). Queues are kept by one of the client's actors
    (:func:`fray.queue.actor_queue`).
    """

    BACKEND = "Monarch"
    ACTOR_CONFIG = frozenset(
        {"max_concurrency", "priority"}
    )  # Monarch restarts nothing; its processes end with the client's
    # A replica of several processes: fray.process._ranks; extras are checked installed, as on local.
    HONOURS = frozenset(
        {"JobRequest.processes_per_task", "JobRequest.priority", "JobRequest.timeout", "EnvironmentConfig.extras"}
    )

    def __init__(self, procs: int | None = None, *, namespace: str | None = None, echo_logs: bool = False) -> None:
        self.procs = check_count(procs, "MonarchClient(procs=")
        super().__init__()
        supervision.configure()
        self.client_id = short_id()
        self.namespace = namespace or f"monarch-{self.client_id}"
        self.spec = "monarch" if procs is None else f"monarch?procs={procs}"
        self._echo = echo_logs
        self._workdir = Path(tempfile.mkdtemp(prefix=f"fray-monarch-{self.client_id}-"))
        # Logs and payloads outlive shutdown() (a finished job's logs stay readable) and go with the client.
        weakref.finalize(self, shutil.rmtree, str(self._workdir), True)
        self._jobs: OwnedWork[MonarchJob] = OwnedWork(lambda job: job.lifecycle.finished)
        self._actors: dict[str, ActorRecord] = {}  # live actors by name
        self._all_actors: list[ActorRecord] = []
        self._meshes: list[HostMesh] = []

    @classmethod
    def from_spec(cls, spec: ClientSpec) -> MonarchClient:
        """Build from ``monarch`` or ``monarch?procs=N``."""
        if spec.address is not None:
            raise spec.invalid("the monarch backend takes no address (it runs on this host)")
        procs = spec.only("monarch", "procs").get("procs")
        if procs is None:
            return cls()
        if not procs.isdigit() or int(procs) < 1:
            raise spec.invalid(f"procs={procs!r} must be a whole number >= 1")
        return cls(procs=int(procs))

    def __repr__(self) -> str:
        return f"MonarchClient(namespace={self.namespace!r}, procs={self.procs})"

    # ----- identity ----------------------------------------------------------------------------

    def _namespace(self) -> str:
        parent = current_job()
        return parent.namespace if parent is not None and parent.namespace else self.namespace

    # ----- jobs --------------------------------------------------------------------------------

    def _start_job(self, request: JobRequest, detached: bool) -> MonarchJobHandle:
        check_processes(request)
        request = dataclasses.replace(request, resources=_check_resources(f"job {request.name!r}", request.resources))
        _check_environment(request.name, request.environment or EnvironmentConfig())
        entry = request.entrypoint
        if isinstance(entry, CallableEntrypoint):
            check_picklable(f"job {request.name!r}", call_parts(entry.callable, entry.args, entry.kwargs))
        job_id = self._child_job_id(request.name)
        workdir = Path(tempfile.mkdtemp(prefix=f"job-{request.name}-", dir=self._workdir))
        job = MonarchJob(job_id, request, self._namespace(), self.spec, workdir, echo=self._echo)
        with self._lock:
            if self._closed:
                raise self._shut_down()
            self._jobs.add(job_id, job)
        job.start()
        return MonarchJobHandle(job, job_id)

    def _known_finished(self, job: MonarchJobHandle) -> bool:
        tracked = job._tracked
        return tracked is not None and tracked.lifecycle.finished

    def _exit_notice(self) -> ExitNotice:
        return _NOTICE

    # ----- actors ------------------------------------------------------------------------------

    def _create_actor(self, start: ActorStart) -> tuple[MonarchActorHandle, MonarchJobHandle]:
        return self._create_actors([start])[0]

    def _create_actors(self, starts: list[ActorStart]) -> list[tuple[MonarchActorHandle, MonarchJobHandle]]:
        """An actor, or a group's members, on one new Monarch process mesh (a process each)."""
        group = starts[0].group[0] if starts[0].group is not None else None
        _check_resources(f"actor group {group!r}" if group else f"actor {starts[0].name!r}", starts[0].resources)
        ids = [self._child_job_id(start.name) for start in starts]
        with self._lock:
            if self._closed:
                raise self._shut_down()
            taken = [start.name for start in starts if start.name in self._actors]
            if taken:
                raise JobAlreadyExists(
                    taken[0],
                    reason="an actor of this name is already running in this client; shut it down first or pick "
                    "another name",
                )
            mesh, records = spawn_mesh(starts, ids, self._namespace(), self.spec, self._workdir, group)
            for record in records:
                self._actors[record.name] = record
            self._all_actors.extend(records)
            self._meshes.append(mesh)
        for record in records:  # outside the lock: an actor already ended calls _forget at once
            record.lifecycle.add_done_callback(functools.partial(self._forget, record))
        mesh.watch()
        members = [(MonarchActorHandle(r.name, r.cls, r.ref, r.job_id), MonarchJobHandle(r, r.job_id)) for r in records]
        for record, (handle, _) in zip(records, members, strict=True):
            record.await_ready(handle)
        return members

    def _forget(self, record: ActorRecord, _: object = None) -> None:
        # A finished actor's name is free again.
        with self._lock:
            if self._actors.get(record.name) is record:
                del self._actors[record.name]

    # ----- the job level -------------------------------------------------------------------------

    def _make_job_context(self) -> MonarchJobContext:
        """This client's job context: tasks on a pool of ``procs`` Monarch processes."""
        return MonarchJobContext(self, self.procs)

    # ----- queues --------------------------------------------------------------------------------

    def _open_queue(self, name: str, exist_ok: bool) -> ActorQueue[Any]:
        """A queue with leases kept by one of this client's actors (:func:`fray.queue.actor_queue`)."""
        return actor_queue(self, name, exist_ok=exist_ok)

    # ----- lifecycle ---------------------------------------------------------------------------

    def _owned_work(self) -> tuple[list[MonarchJobHandle], list[ActorRecord]]:
        with self._lock:
            return [MonarchJobHandle(job, job.job_id) for job in self._jobs.values()], list(self._all_actors)

    def _release(self) -> None:
        """Returns once the actors' processes are stopped."""
        with self._lock:
            meshes = list(self._meshes)
        for mesh in meshes:
            mesh.join(timeout=60)
