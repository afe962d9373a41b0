"""Live stacks on Iris (``fray.iris._stacks``): what the conformance suite does not pin down.

A replica of several processes per task shows each rank (each leaves its own record); a job that
has finished has no stacks; a binary job, which runs no Fray runtime, says so instead of hanging.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import fray
from fray import Entrypoint, JobRequest, JobStatus
from support import wait_until


def ranked_sleep(stop: str) -> None:
    deadline = time.monotonic() + 120
    while not Path(stop).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _functions(process: fray.ProcessStacks) -> set[str]:
    return {frame.function for thread in process.threads for frame in thread.frames}


def _relay(record: str) -> subprocess.CompletedProcess[str]:
    from fray.iris import _stacks

    command = ["sh", "-c", _stacks._RELAY, "fray-stacks", record, _stacks._ASK, "0", "5"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_the_relay_asks_every_rank_the_records_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # What Iris runs in the task's container, run here: no Iris needed.
    from fray.iris import _stacks

    task = f"/test/relay-{uuid.uuid4().hex[:8]}/0"
    release = threading.Event()

    def rank_waits_here() -> None:
        release.wait(60)

    waiter = threading.Thread(target=rank_waits_here, daemon=True)
    waiter.start()
    try:
        monkeypatch.setenv("IRIS_TASK_ID", f"{task}:0")
        for rank in ("0", "1"):  # two records of this one process, as two ranks would leave
            monkeypatch.setenv("FRAY_LOCAL_PROCESS_INDEX", rank)
            _stacks.announce()
        run = _relay(_stacks.record_name(task))
        assert run.returncode == 0, run.stderr
        reply = json.loads(run.stdout)
        found = [p for answer in reply["answers"] for p in _stacks._split("replica 0", reply["host"], answer)]
        assert sorted(p.label for p in found) == ["replica 0 process 0", "replica 0 process 1"]
        assert all("rank_waits_here" in _functions(p) for p in found)
    finally:
        release.set()
    missing = _relay(_stacks.record_name("/test/never/0"))
    assert missing.returncode == 3 and "no Fray stack server" in missing.stderr


def test_each_rank_of_an_iris_replica_shows_its_stack(iris_client, uid, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    job = iris_client.submit(
        JobRequest(
            name=f"ranks-{uid}",
            entrypoint=Entrypoint.from_callable(ranked_sleep, args=(str(stop),)),
            processes_per_task=2,
        )
    )
    try:

        def both() -> list[fray.ProcessStacks] | None:
            found = [p for p in job.stacks(timeout=10) if "ranked_sleep" in _functions(p)]
            return found if len(found) == 2 else None

        found = wait_until(both, timeout=120, what="ranked_sleep in both ranks")
        assert sorted(p.label for p in found) == ["replica 0 process 0", "replica 0 process 1"]
        assert all(p.pid is not None and p.host for p in found)
    finally:
        stop.touch()
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED
    assert job.stacks(timeout=5) == ()


def test_an_iris_binary_job_says_it_has_no_stack_server(iris_client, uid, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    script = f"import time, pathlib\nwhile not pathlib.Path({str(stop)!r}).exists(): time.sleep(0.05)\n"
    job = iris_client.submit(
        JobRequest(name=f"binary-{uid}", entrypoint=Entrypoint.from_binary(sys.executable, ["-c", script]))
    )
    try:
        wait_until(lambda: job.status() == JobStatus.RUNNING, timeout=120, what="the binary job to run")

        def answered() -> list[fray.ProcessStacks]:
            # Until its task runs (Iris may still report it ASSIGNED) the replica says it is not running.
            return [p for p in job.stacks(timeout=5) if p.error and "no Fray stack server" in p.error]

        started = time.monotonic()
        (replica,) = wait_until(answered, timeout=60, what="the binary job's replica to answer")
        assert time.monotonic() - started < 60
        assert replica.label == "replica 0" and not replica.threads
    finally:
        stop.touch()
        job.terminate()
