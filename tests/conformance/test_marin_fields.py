"""marin's job fields a backend honours or refuses by name: ``processes_per_task`` and ``EnvironmentConfig.extras``.

A backend declares what it honours in its client's ``HONOURS``; on a backend that does not
honour a field, each test checks that a job setting it is refused at submit with a
``ConfigError`` naming the field (Fray never ignores a setting silently).

``processes_per_task=N``: every replica runs N processes of the entrypoint, each seeing its
rank in ``FRAY_PROCESS_INDEX`` / ``FRAY_PROCESS_COUNT`` / ``FRAY_LOCAL_PROCESS_INDEX`` /
``FRAY_LOCAL_PROCESS_COUNT`` and in ``current_job()``; one failing process fails the replica.

``extras``: names of extras (or dependency groups) of the job's project. A Fray cluster
installs what they bring into the job's environment (here msgpack, from the package index
or uv's cache, as tests/cluster/test_environments.py does); the local backend checks, at
submit, that it is installed here.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from pathlib import Path

import pytest

from fray import ConfigError, Entrypoint, EnvironmentConfig, GpuConfig, JobFailed, JobRequest, JobStatus, current_job
from fray.cluster.client import ClusterClient
from fray.resources import ResourceConfig
from support import alive, wait_until

RANKS = "JobRequest.processes_per_task"
EXTRAS = "EnvironmentConfig.extras"
RANK_VARS = ("FRAY_PROCESS_INDEX", "FRAY_PROCESS_COUNT", "FRAY_LOCAL_PROCESS_INDEX", "FRAY_LOCAL_PROCESS_COUNT")
# A distribution no index has: the local backend refuses it at submit, a cluster fails installing it.
MISSING = "fray-no-such-distribution-anywhere"

# Written by every process of a binary job: its rank variables, in a file named by its rank.
RECORD_SCRIPT = """
import json, os, sys
ranks = {k: os.environ.get(k) for k in sys.argv[2:]}
with open(os.path.join(sys.argv[1], f"rank-{ranks['FRAY_PROCESS_INDEX']}.json"), "x") as f:
    json.dump({"env": ranks, "replica_index": int(os.environ["FRAY_REPLICA_INDEX"])}, f)
print("recorded", ranks["FRAY_PROCESS_INDEX"])
"""


def record_rank(directory: str) -> None:
    """Write what this process sees of its rank to ``rank-{process_index}.json`` (once: ``x`` mode)."""
    info = current_job()
    assert info is not None
    seen = {
        "env": {k: os.environ.get(k) for k in RANK_VARS},
        "replica_index": info.replica_index,
        "info": [info.process_index, info.process_count, info.local_process_index, info.local_process_count],
        "pid": os.getpid(),
    }
    with open(Path(directory, f"rank-{info.process_index}.json"), "x") as f:
        json.dump(seen, f)


def fail_in_local_process_one() -> None:
    info = current_job()
    assert info is not None
    if info.local_process_index == 1:
        raise ValueError(f"process {info.process_index} fails on purpose")
    threading.Event().wait()  # never returns: the supervisor stops it when its sibling fails


def import_msgpack() -> str:
    import msgpack  # what the extra brings

    return str(msgpack.version)


def _refused(client, field: str, request: JobRequest) -> bool:
    """True where ``client``'s backend does not honour ``field``, after checking it refuses ``request`` naming it."""
    if field in type(client).HONOURS:
        return False
    with pytest.raises(ConfigError, match=re.escape(field.split(".")[1])):
        client.submit(request)
    return True


def _ranks(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank-*.json"))]


@pytest.mark.parametrize("replicas", [1, 2])
def test_every_process_of_every_replica_sees_its_rank_once(client, uid, tmp_path, replicas):
    request = JobRequest(
        name=f"ranks-{uid}",
        entrypoint=Entrypoint.from_callable(record_rank, args=(str(tmp_path),)),
        replicas=replicas,
        processes_per_task=2,
    )
    if _refused(client, RANKS, request):
        return
    assert client.submit(request).wait(timeout=120) == JobStatus.SUCCEEDED
    seen = _ranks(tmp_path)
    assert len(seen) == replicas * 2, seen
    for rank in seen:
        index, count, local, local_count = rank["info"]
        assert rank["env"] == {
            "FRAY_PROCESS_INDEX": str(index),
            "FRAY_PROCESS_COUNT": str(count),
            "FRAY_LOCAL_PROCESS_INDEX": str(local),
            "FRAY_LOCAL_PROCESS_COUNT": str(local_count),
        }
        assert (count, local_count) == (replicas * 2, 2)
        assert index == rank["replica_index"] * 2 + local
    assert sorted(rank["info"][0] for rank in seen) == list(range(replicas * 2))
    assert len({rank["pid"] for rank in seen}) == replicas * 2  # each a process of its own


def test_a_process_that_raises_fails_the_job_with_the_users_exception(client, uid):
    request = JobRequest(
        name=f"rank-fails-{uid}",
        entrypoint=Entrypoint.from_callable(fail_in_local_process_one),
        processes_per_task=2,
    )
    if _refused(client, RANKS, request):
        return
    job = client.submit(request)
    # Process 0 would wait for ever: the job ends only because it was stopped when process 1 failed.
    with pytest.raises(ValueError, match="process 1 fails on purpose") as raised:
        job.wait(timeout=120)
    assert isinstance(raised.value, JobFailed)
    assert job.status() == JobStatus.FAILED


def test_a_binary_job_runs_its_processes_with_their_ranks_and_tagged_output(client, uid, tmp_path):
    request = JobRequest(
        name=f"rank-bin-{uid}",
        entrypoint=Entrypoint.from_binary(sys.executable, ["-c", RECORD_SCRIPT, str(tmp_path), *RANK_VARS]),
        replicas=2,
        processes_per_task=2,
    )
    if _refused(client, RANKS, request):
        return
    job = client.submit(request)
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED
    seen = _ranks(tmp_path)
    assert sorted(int(rank["env"]["FRAY_PROCESS_INDEX"]) for rank in seen) == [0, 1, 2, 3]
    for rank in seen:
        local = int(rank["env"]["FRAY_LOCAL_PROCESS_INDEX"])
        assert int(rank["env"]["FRAY_PROCESS_INDEX"]) == rank["replica_index"] * 2 + local
        assert rank["env"]["FRAY_PROCESS_COUNT"] == "4" and rank["env"]["FRAY_LOCAL_PROCESS_COUNT"] == "2"
    # Each line is tagged with the local rank of the process that printed it.
    wanted = {f"[proc {index % 2}] recorded {index}" for index in range(4)}
    lines = wait_until(lambda: wanted <= set(job.logs()) and job.logs(), what="the tagged lines")
    assert wanted <= set(lines), lines


def test_terminate_stops_every_process_of_a_replica(client, uid):
    script = "import os, threading; print('pid', os.getpid(), flush=True); threading.Event().wait()"
    request = JobRequest(
        name=f"rank-stop-{uid}",
        entrypoint=Entrypoint.from_binary(sys.executable, ["-c", script]),
        processes_per_task=2,
    )
    if _refused(client, RANKS, request):
        return
    job = client.submit(request)

    def both_pids() -> list[int] | None:
        pids = [int(line.split()[-1]) for line in job.logs() if " pid " in line]
        return pids if len(pids) == 2 else None

    pids = wait_until(both_pids, what="both processes to start")
    job.terminate()
    assert job.wait(timeout=60) == JobStatus.STOPPED
    assert not any(alive(pid) for pid in pids)  # the supervisor returns once its processes are gone


def test_processes_that_do_not_divide_the_gpus_are_refused_at_submit(client, uid):
    request = JobRequest(
        name=f"rank-gpus-{uid}",
        entrypoint=Entrypoint.from_binary("true"),
        resources=ResourceConfig(device=GpuConfig("auto", count=3)),
        processes_per_task=2,
    )
    with pytest.raises(ConfigError, match="processes_per_task"):
        client.submit(request)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with an extra and a dependency group that bring an installed distribution, and one that does not."""
    directory = tmp_path / "project"
    directory.mkdir()
    (directory / "pyproject.toml").write_text(
        f"""
[project]
name = "fray-extras-demo"
version = "0.1"
dependencies = []

[project.optional-dependencies]
fast = ["msgpack>=1.0"]
absent = ["{MISSING}==0.0.1"]

[dependency-groups]
tools = ["msgpack"]
"""
    )
    return directory


def extras_job(name: str, project: Path, extras: list[str]) -> JobRequest:
    return JobRequest(
        name=name,
        entrypoint=Entrypoint.from_callable(import_msgpack),
        environment=EnvironmentConfig(workspace=str(project), extras=extras),
    )


@pytest.mark.parametrize("extra", ["fast", "tools"])
def test_a_job_gets_what_its_projects_extra_or_group_brings(client, uid, project, extra):
    request = extras_job(f"extras-{uid}", project, [extra])
    if _refused(client, EXTRAS, request):
        return
    assert client.submit(request).wait(timeout=180) == JobStatus.SUCCEEDED


def test_an_extra_whose_distribution_is_missing_is_named(client, uid, project):
    request = extras_job(f"extras-absent-{uid}", project, ["absent"])
    if _refused(client, EXTRAS, request):
        return
    if isinstance(client, ClusterClient):  # a cluster installs extras: the installer cannot find it
        with pytest.raises(JobFailed, match=MISSING):
            client.submit(request).wait(timeout=180)
    else:  # the job would run in this environment: refused at submit
        with pytest.raises(ConfigError, match=MISSING):
            client.submit(request)


def test_an_extra_the_project_lacks_is_refused_naming_what_it_has(client, uid, project):
    request = extras_job(f"extras-unknown-{uid}", project, ["fast", "nope"])
    if _refused(client, EXTRAS, request):
        return
    with pytest.raises(ConfigError, match=r"'nope'.*\['absent', 'fast'\].*\['tools'\]"):
        client.submit(request)


def test_extras_without_a_project_are_refused_saying_to_give_the_workspace(client, uid, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the local backend's project is the current directory's: none here
    request = JobRequest(
        name=f"extras-nowhere-{uid}",
        entrypoint=Entrypoint.from_callable(import_msgpack),
        environment=EnvironmentConfig(extras=["fast"]),
    )
    if _refused(client, EXTRAS, request):
        return
    with pytest.raises(ConfigError, match=re.escape("EnvironmentConfig(workspace=...)")):
        client.submit(request)
