"""The client host of ``test_hosts.py``: submits from a machine that has only a user credential and an address.

Run as ``python client_host.py DIRECTORY`` with ``FRAY_CLIENT_SPEC=fray://HOST:PORT`` and
``FRAY_CREDENTIAL=<the line fray token create --role user:NAME printed>`` and nothing else of the
cluster's (no CA file: the credential pins the CA). 20 jobs and a 2-replica gang; each task
writes the inode of its network namespace (which simulated host ran it) to ``DIRECTORY``.
Prints one JSON line: the user the jobs belong to and their states.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import fray
from fray import Entrypoint, JobRequest, ResourceConfig, current_job


def where(directory: str, tag: str) -> None:
    info = current_job()
    suffix = f"-{info.replica_index}" if info is not None and info.replica_count > 1 else ""
    Path(directory, tag + suffix).write_text(str(os.stat("/proc/self/ns/net").st_ino))


def main(directory: str) -> None:
    client = fray.current_client()
    jobs = [
        client.submit(
            JobRequest(
                name=f"job-{i}",
                entrypoint=Entrypoint.from_callable(where, args=(directory, f"job-{i}")),
                resources=ResourceConfig(cpu=0.5),
            )
        )
        for i in range(20)
    ]
    gang = client.submit(
        JobRequest(
            name="gang",
            entrypoint=Entrypoint.from_callable(where, args=(directory, "gang")),
            resources=ResourceConfig(cpu=1),  # one replica per worker host: each offers one core
            replicas=2,
        )
    )
    states = [job.wait(timeout=120).value for job in [*jobs, gang]]
    print(json.dumps({"states": states, "user": gang.view().user}))  # type: ignore[attr-defined]


if __name__ == "__main__":
    main(sys.argv[1])
