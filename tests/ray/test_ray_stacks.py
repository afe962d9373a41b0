"""Live stacks on Ray (``fray.ray._stacks``): what the conformance suite does not pin down.

The job-context task's id is the ref id its creator holds; the actor answers through its control
group while its only call slot is blocked; a terminated actor and a finished job answer at once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import fray
from fray import Entrypoint, JobRequest, JobStatus
from support import wait_until

ray = pytest.importorskip("ray", reason='the Ray backend needs Ray: pip install "fray[ray]"')


def stuck_in_task(release: str) -> None:
    while not Path(release).exists():
        time.sleep(0.05)


def job_with_task(ref_file: str, release: str) -> None:
    ctx = fray.get_job_context()
    ref = ctx.create_task(stuck_in_task, release)
    Path(ref_file).write_text(ref.ref_id)
    ctx.get(ref)


class Blocking:
    def __init__(self) -> None:
        self.event = threading.Event()

    def block(self) -> None:
        self.event.wait(60)


def _names(process: fray.ProcessStacks) -> set[str]:
    return {frame.function for thread in process.threads for frame in thread.frames}


def test_a_task_is_named_by_the_ref_id_its_creator_holds(ray_client, tmp_path: Path) -> None:
    ref_file, release = tmp_path / "ref", tmp_path / "release"
    job = ray_client.submit(
        JobRequest(
            name="with-task", entrypoint=Entrypoint.from_callable(job_with_task, args=(str(ref_file), str(release)))
        )
    )
    try:
        wait_until(ref_file.exists, timeout=60)

        def task_seen() -> list[fray.ProcessStacks]:
            return [p for p in job.stacks(timeout=10) if p.task_id is not None and "stuck_in_task" in _names(p)]

        found = wait_until(task_seen, timeout=30)
        assert found[0].task_id == ref_file.read_text()
        assert found[0].label == f"task {ref_file.read_text()}"
        replica = [p for p in job.stacks(timeout=10) if p.label == "replica 0"]
        assert replica and "job_with_task" in _names(replica[0])
    finally:
        release.write_text("go")
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    assert job.stacks() == ()


def test_a_blocked_actor_answers_through_its_control_group(ray_client) -> None:
    hosted = ray_client.host_actor(Blocking, name="blocking")
    actor = hosted.handle
    actor.block.remote()
    found = wait_until(lambda: [p for p in actor.stacks(timeout=10) if "block" in _names(p)], timeout=30)
    assert found[0].label == "actor 'blocking'" and found[0].pid is not None and found[0].error is None
    hosted.shutdown()
    started = time.monotonic()
    (dead,) = actor.stacks(timeout=5)
    assert dead.error is not None and time.monotonic() - started < 6


def test_a_terminated_job_leaves_no_task_keys_behind(ray_client, tmp_path: Path) -> None:
    from ray.experimental import internal_kv

    from fray.ray._stacks import task_prefix
    from fray.ray.inside._worker import KV_NAMESPACE

    ref_file, release = tmp_path / "ref", tmp_path / "release"
    job = ray_client.submit(
        JobRequest(
            name="killed", entrypoint=Entrypoint.from_callable(job_with_task, args=(str(ref_file), str(release)))
        )
    )
    wait_until(lambda: [p for p in job.stacks(timeout=10) if p.task_id], timeout=60, what="the task's stacks")
    job.terminate()

    def keys() -> list[bytes]:
        return list(internal_kv._internal_kv_list(task_prefix(job.job_id), namespace=KV_NAMESPACE))

    wait_until(lambda: not keys(), timeout=30, what="the task's key to go")
    release.write_text("go")  # in case Ray left the task running
