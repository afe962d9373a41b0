"""Spawning Fray actors on Monarch: one process mesh per actor or group, one :class:`FrayHost` per process."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from monarch.actor import this_host

from fray.core._client_core import ActorStart, short_id
from fray.core._codepickle import dumps
from fray.job import JobInfo
from fray.monarch.actors import ActorRecord, HostMesh
from fray.monarch.host import FrayHost, MemberSpec

__all__ = ["spawn_mesh"]


def spawn_mesh(
    starts: list[ActorStart], job_ids: list[str], namespace: str, spec: str, workdir: Path, group: str | None
) -> tuple[HostMesh, list[ActorRecord]]:
    """One process mesh with a process per start (the members of ``group``, or one actor); their records.

    Every start is of the same class and arguments (a group's members), built in its
    process from one payload; each logs to its own file under ``workdir``.
    """
    first = starts[0]
    payload = dumps((first.actor_class, first.args, first.kwargs))
    names = [start.name for start in starts]
    logs = [workdir / f"actor-{name}-{short_id()}.log" for name in names]
    members = [
        MemberSpec(
            JobInfo(job_id, name, 0, 1, namespace, 0, "cpu", priority_band=first.config.priority),
            spec,
            str(log),
            group,
            index,
            first.config.max_concurrency,
        )
        for index, (job_id, name, log) in enumerate(zip(job_ids, names, logs, strict=True))
    ]
    # Monarch reports failures of "{name}-{suffix}", and drops punctuation from names: letters and
    # digits only, so that the name in a report is the name we registered. The process mesh has the
    # same name, so that a failure reported for the processes themselves is recognised as ours too.
    spawn_name = "fray" + re.sub(r"[^A-Za-z0-9]", "", names[0])[:40] + uuid.uuid4().hex[:12]
    procs = this_host().spawn_procs(per_host={"procs": len(names)}, name=spawn_name)
    hosts = procs.spawn(spawn_name, FrayHost, members, payload)
    mesh = HostMesh(procs, hosts, spawn_name)
    refs = [hosts] if len(names) == 1 else [hosts.slice(procs=i) for i in range(len(names))]
    records = [
        ActorRecord(name, job_id, first.actor_class, ref, mesh, log)
        for name, job_id, ref, log in zip(names, job_ids, refs, logs, strict=True)
    ]
    mesh.members = records
    return mesh, records
