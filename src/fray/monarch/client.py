"""``MonarchClient``: the :class:`~fray.client.Client` protocol on PyTorch Monarch (spec ``monarch``).

Jobs are processes on this host driven from the client (:mod:`fray.monarch.jobs`);
actors are Monarch actors, each on a process of a Monarch process mesh
(:mod:`fray.monarch.actors`); a group's members are the ranks of one mesh. The
mapping, its limits and the supervision settings are described in ``docs/monarch.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import re
import shutil
import tempfile
import uuid
import weakref
from pathlib import Path
from typing import Any

from monarch.actor import this_host

from fray._adopt import is_named
from fray._client_core import ClientCore
from fray._codepickle import dumps
from fray._driver_exit import ExitNotice, JobsAtExit
from fray._serialization import call_parts, check_picklable
from fray.actor import ActorGroup, check_actor_request, group_member_names
from fray.actor_config import ActorConfig, check_actor_config_supported
from fray.client import ClientSpec
from fray.errors import ConfigError, JobAlreadyExists
from fray.job import CallableEntrypoint, EnvironmentConfig, JobInfo, JobRequest, current_job
from fray.monarch import supervision
from fray.monarch.actors import ActorRecord, HostMesh, MonarchActorHandle
from fray.monarch.context import MonarchJobContext
from fray.monarch.host import FrayHost, MemberSpec
from fray.monarch.jobs import MonarchJob, MonarchJobHandle
from fray.queue import ActorQueue, actor_queue
from fray.resources import CpuConfig, ResourceConfig

__all__ = ["MonarchClient"]

_REQ_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


# The ActorConfig fields this backend honours: Monarch restarts nothing, and its processes end with the client's.
_ACTOR_CONFIG = frozenset({"max_concurrency"})

_NOTICE = ExitNotice("Monarch", why_ended="Monarch jobs are processes of this script's host")
_AT_EXIT = JobsAtExit()


def _short_id() -> str:
    return uuid.uuid4().hex[:8]


def _check_resources(what: str, resources: ResourceConfig) -> ResourceConfig:
    """Refuse, by name, the resource fields the Monarch backend cannot honour on one host; the CPU placement."""
    if resources.regions is not None:
        raise ConfigError(
            f"{what}: ResourceConfig(regions={list(resources.regions)!r}) cannot be honoured by the Monarch backend, "
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
    missing = []
    for requirement in environment.pip_packages:
        match = _REQ_NAME_RE.match(requirement)
        try:
            importlib.metadata.distribution(match.group(1) if match else requirement)
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement)
    if missing:
        raise ConfigError(
            f"job {name!r} needs pip packages {missing} that are not installed; the Monarch backend runs jobs in "
            f"this Python environment, so install them first: pip install {' '.join(missing)}"
        )


class MonarchClient(ClientCore["MonarchJobHandle", "MonarchActorHandle"]):
    """Jobs as processes on this host, actors as Monarch actors on process meshes.

    ``procs`` (spec ``monarch?procs=N``) is the size of the pool of pre-spawned worker
    processes that tasks will run on (the job-level API; see ``docs/monarch.md``).
    Limits: everything runs on this host; ``cpu``, ``ram`` and ``disk`` are not
    enforced; accelerators and ``regions`` are refused; ``docker_image`` is refused and
    ``pip_packages`` must already be installed; job handles work in this process only.

    A job's processes are the script's own children, so its jobs end with it whatever
    ``detached`` says (the driver-exit rule, :mod:`fray._driver_exit`); at exit, Fray names
    the ones that were still running. An actor runs on a new Monarch process (a group on
    one process mesh); of :class:`~fray.actor_config.ActorConfig`, ``max_concurrency`` is
    honoured, restarts, call retries and a detached lifetime are refused by name (see
    ``docs/monarch.md``). Queues are kept by one of the client's actors
    (:func:`fray.queue.actor_queue`).
    """

    BACKEND = "Monarch"

    def __init__(self, procs: int | None = None, *, namespace: str | None = None, echo_logs: bool = False) -> None:
        if procs is not None and (isinstance(procs, bool) or not isinstance(procs, int) or procs < 1):
            raise ConfigError(f"MonarchClient(procs={procs!r}) must be a whole number >= 1 or None")
        super().__init__()
        supervision.configure()
        self.client_id = _short_id()
        self.namespace = namespace or f"monarch-{self.client_id}"
        self.procs = procs
        self.spec = "monarch" if procs is None else f"monarch?procs={procs}"
        self._echo = echo_logs
        self._workdir = Path(tempfile.mkdtemp(prefix=f"fray-monarch-{self.client_id}-"))
        # Logs and payloads outlive shutdown() (a finished job's logs stay readable) and go with the client.
        weakref.finalize(self, shutil.rmtree, str(self._workdir), True)
        self._jobs: list[MonarchJob] = []
        self._actors: dict[str, ActorRecord] = {}  # live actors by name
        self._all_actors: list[ActorRecord] = []
        self._meshes: list[HostMesh] = []

    @classmethod
    def from_spec(cls, spec: ClientSpec) -> MonarchClient:
        """Build from ``monarch`` or ``monarch?procs=N``."""
        if spec.address is not None:
            raise spec.invalid("the monarch backend takes no address (it runs on this host)")
        unknown = set(spec.options) - {"procs"}
        if unknown:
            raise spec.invalid(f"unknown option(s) {sorted(unknown)} for monarch")
        procs = spec.options.get("procs")
        if procs is None:
            return cls()
        if not procs.isdigit() or int(procs) < 1:
            raise spec.invalid(f"procs={procs!r} must be a whole number >= 1")
        return cls(procs=int(procs))

    def __repr__(self) -> str:
        return f"MonarchClient(namespace={self.namespace!r}, procs={self.procs})"

    # ----- identity ----------------------------------------------------------------------------

    def _new_job_id(self, name: str) -> str:
        parent = current_job()
        local_id = f"{name}-{_short_id()}"
        return f"{parent.job_id}/{local_id}" if parent is not None else local_id

    def _namespace(self) -> str:
        parent = current_job()
        return parent.namespace if parent is not None and parent.namespace else self.namespace

    # ----- jobs --------------------------------------------------------------------------------

    def _start_job(self, request: JobRequest, detached: bool) -> MonarchJobHandle:
        request = dataclasses.replace(request, resources=_check_resources(f"job {request.name!r}", request.resources))
        _check_environment(request.name, request.environment or EnvironmentConfig())
        entry = request.entrypoint
        if isinstance(entry, CallableEntrypoint):
            check_picklable(f"job {request.name!r}", call_parts(entry.callable, entry.args, entry.kwargs))
        job_id = self._new_job_id(request.name)
        workdir = Path(tempfile.mkdtemp(prefix=f"job-{request.name}-", dir=self._workdir))
        job = MonarchJob(job_id, request, self._namespace(), self.spec, workdir, echo=self._echo)
        with self._lock:
            if self._closed:
                raise self._shut_down()
            self._jobs.append(job)
        job.start()
        handle = MonarchJobHandle(job, job_id)
        _AT_EXIT.track(handle, _NOTICE, detached=detached, outlives_driver=False)
        return handle

    def _live_job(self, request: JobRequest) -> MonarchJobHandle | None:
        """A PENDING or RUNNING job named as ``request`` that this client submitted."""
        name = request.name
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            handle = MonarchJobHandle(job, job.job_id)
            if is_named(job.job_id, name) and not handle.status().finished:
                return handle
        return None

    # ----- actors ------------------------------------------------------------------------------

    def _create_actor(
        self,
        actor_class: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
        resources: ResourceConfig | None,
        actor_config: ActorConfig | None,
        group: tuple[str, int] | None,
    ) -> tuple[MonarchActorHandle, MonarchJobHandle]:
        """One actor on a new Monarch process (groups are made whole, on one mesh, by create_actor_group)."""
        reserved, config = check_actor_request(actor_class, name, resources, args, kwargs, actor_config)
        check_actor_config_supported("Monarch", config, _ACTOR_CONFIG)
        _check_resources(f"actor {name!r}", reserved)
        handles, records = self._spawn(actor_class, args, kwargs, [name], config, None)
        return handles[0], MonarchJobHandle(records[0], records[0].job_id)

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
        """Start ``count`` actors ``{name}-0`` ... on one Monarch process mesh of ``count`` processes."""
        self._check_open()
        names = group_member_names(name, count)
        reserved, config = check_actor_request(actor_class, names[0], resources, args, kwargs, actor_config)
        check_actor_config_supported("Monarch", config, _ACTOR_CONFIG)
        _check_resources(f"actor group {name!r}", reserved)
        handles, records = self._spawn(actor_class, args, kwargs, names, config, name)
        return ActorGroup(handles, [MonarchJobHandle(record, record.job_id) for record in records], name)

    def _spawn(
        self,
        cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        names: list[str],
        config: ActorConfig,
        group: str | None,
    ) -> tuple[list[MonarchActorHandle], list[ActorRecord]]:
        payload = dumps((cls, args, kwargs))
        namespace = self._namespace()
        ids = [self._new_job_id(name) for name in names]
        logs = [self._workdir / f"actor-{name}-{_short_id()}.log" for name in names]
        members = [
            MemberSpec(
                JobInfo(job_id, name, 0, 1, namespace, 0, "cpu"),
                self.spec,
                str(log),
                group,
                index,
                config.max_concurrency,
            )
            for index, (job_id, name, log) in enumerate(zip(ids, names, logs, strict=True))
        ]
        with self._lock:
            if self._closed:
                raise self._shut_down()
            taken = [name for name in names if name in self._actors]
            if taken:
                raise JobAlreadyExists(
                    f"an actor named {taken[0]!r} is already running in this client; shut it down first or pick "
                    "another name"
                )
            # Monarch reports failures of "{name}-{suffix}", and drops punctuation from names: letters and
            # digits only, so that the name in a report is the name we registered. The process mesh has the
            # same name, so that a failure reported for the processes themselves is recognised as ours too.
            spawn_name = "fray" + re.sub(r"[^A-Za-z0-9]", "", names[0])[:40] + uuid.uuid4().hex[:12]
            procs = this_host().spawn_procs(per_host={"procs": len(names)}, name=spawn_name)
            hosts = procs.spawn(spawn_name, FrayHost, members, payload)
            mesh = HostMesh(procs, hosts, spawn_name)
            refs = [hosts] if len(names) == 1 else [hosts.slice(procs=i) for i in range(len(names))]
            records = [
                ActorRecord(name, job_id, cls, ref, mesh, log)
                for name, job_id, ref, log in zip(names, ids, refs, logs, strict=True)
            ]
            mesh.members = records
            for record in records:
                self._actors[record.name] = record
                record.lifecycle.add_done_callback(functools.partial(self._forget, record))
            self._all_actors.extend(records)
            self._meshes.append(mesh)
        mesh.watch()
        handles = [MonarchActorHandle(r.name, cls, r.ref, r.job_id) for r in records]
        for record, handle in zip(records, handles, strict=True):
            record.await_ready(handle)
        return handles, records

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

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting work; with ``wait``, let running jobs finish first; then stop jobs and actors.

        Returns once the actors' processes are stopped.
        """
        with self._lock:
            self._closed = True
            jobs, actors, meshes = list(self._jobs), list(self._all_actors), list(self._meshes)
        # Jobs first, actors after: running jobs may still be calling the actors.
        for job in jobs:
            if wait:
                job.lifecycle.wait_done()
            else:
                job.terminate()
        for record in actors:
            record.terminate()
        for mesh in meshes:
            mesh.join(timeout=60)
