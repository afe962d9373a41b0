"""Every Ray job kind on the shared lifecycle: retries, wording, wait_all, and actor errors in the one form."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

import fray
from backends.ray import RAY_TEST_CPUS
from fray import (
    ActorDiedError,
    ActorUnavailableError,
    Entrypoint,
    JobFailed,
    JobRequest,
    JobStatus,
    RemoteError,
    ResourceConfig,
    current_job,
)
from fray.core._lifecycle import Failure, RetryBudget
from fray.ray import RayJobHandle
from support import wait_until

ray = pytest.importorskip("ray", reason='the Ray backend needs Ray: pip install "fray[ray]"')


class ConfigMissing(Exception):
    """A user exception raised by a constructor."""


class BrokenAtBirth:
    def __init__(self) -> None:
        raise ConfigMissing("no config file")

    def ping(self) -> str:
        return "pong"


class Lookup:
    async def find(self, key: str) -> str:
        raise KeyError(key)

    def get(self, key: str) -> str:
        raise LookupError(key)


def spin(marker: str) -> None:
    Path(marker).write_text("running")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # stopped by terminate() long before
        time.sleep(0.05)


def quick() -> None:
    print("quick done")


def fail_first_attempt() -> None:
    info = current_job()
    assert info is not None
    print(f"attempt {info.attempt}")
    if info.attempt == 0:
        raise RuntimeError("first attempt fails")


def callable_job(name: str, fn, *args, **kwargs) -> JobRequest:
    return JobRequest(name=name, entrypoint=Entrypoint.from_callable(fn, args=args), **kwargs)


def binary_job(name: str, script: str, **kwargs) -> JobRequest:
    return JobRequest(name=name, entrypoint=Entrypoint.from_binary(sys.executable, ["-c", script]), **kwargs)


PRINT_ATTEMPT_THEN_FAIL = "import os, sys; print('attempt', os.environ['FRAY_ATTEMPT']); sys.exit(3)"


# ----- callable jobs ---------------------------------------------------------------------------


def test_retried_callable_job_says_so_in_its_logs(ray_client, uid) -> None:
    job = ray_client.submit(callable_job(f"retry-{uid}", fail_first_attempt, max_retries_failure=1))
    assert job.wait(timeout=90) == JobStatus.SUCCEEDED
    logs = job.logs()
    assert "attempt 0" in logs and "attempt 1" in logs
    assert any(line.startswith("[fray] attempt 0 failed, retrying after failure 1 of 1 allowed") for line in logs)


def test_a_finished_job_is_freed_as_soon_as_its_handle_is_dropped(ray_client, uid) -> None:
    # A driver submitting many quick jobs must not keep them: nothing may hold a finished job but its
    # handle, and no cycle may leave it to the cyclic collector (off here, so only references count).
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        jobs = [ray_client.submit(callable_job(f"drop-{uid}-{i}", int, timeout=600 if i else None)) for i in range(2)]
        assert [job.wait(timeout=90) for job in jobs] == [JobStatus.SUCCEEDED] * 2
        refs = [weakref.ref(job) for job in jobs]
        del jobs
        # The reaper lets go of a finished job at its next pass.
        wait_until(lambda: all(ref() is None for ref in refs), timeout=10, what="the dropped jobs to be freed")
    finally:
        gc.enable()


# ----- binary jobs -----------------------------------------------------------------------------


def test_binary_job_is_resubmitted_within_its_failure_budget(ray_client, uid) -> None:
    script = "import os, sys; a = int(os.environ['FRAY_ATTEMPT']); print(f'attempt {a}'); sys.exit(3 if a == 0 else 0)"
    job = ray_client.submit(binary_job(f"bin-retry-{uid}", script, max_retries_failure=1))
    assert job.wait(timeout=180) == JobStatus.SUCCEEDED
    lines = wait_until(lambda: "attempt 1" in job.logs() and job.logs(), timeout=60, what="both attempts' logs")
    assert "attempt 0" in lines


def test_binary_job_out_of_budget_fails_with_the_shared_wording(ray_client, uid) -> None:
    job = ray_client.submit(binary_job(f"bin-fail-{uid}", PRINT_ATTEMPT_THEN_FAIL, max_retries_failure=1))
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=180)
    last = Failure.from_exit(sys.executable, 3, ["attempt 1"])
    assert info.value.message == RetryBudget(1, 100, failures=1).exhausted_message(last)
    assert info.value.exit_code == 3


# ----- wait_all --------------------------------------------------------------------------------


def test_wait_some_returns_once_one_job_finished(ray_client, uid, tmp_path: Path) -> None:
    marker = tmp_path / "spinning"
    spinner = ray_client.submit(callable_job(f"spin-{uid}", spin, str(marker)))
    try:
        wait_until(marker.exists, timeout=60, what="the spinning job to start")
        done = ray_client.submit(callable_job(f"quick-{uid}", quick))
        statuses = RayJobHandle._fray_wait_some([spinner, done], timeout=60)
        assert statuses[1] == JobStatus.SUCCEEDED
        assert not statuses[0].finished
        # Nothing finishes within the timeout: the current statuses come back, nothing raises.
        assert not RayJobHandle._fray_wait_some([spinner], timeout=0.3)[0].finished
    finally:
        spinner.terminate()


def test_wait_all_waits_on_every_job_kind_at_once(ray_client, uid) -> None:
    jobs = [
        ray_client.submit(callable_job(f"a-{uid}", quick)),
        ray_client.submit(binary_job(f"b-{uid}", "print('binary done')")),
        ray_client.submit(callable_job(f"c-{uid}", fail_first_attempt, max_retries_failure=1)),
    ]
    assert len({type(job)._fray_wait_some.__func__ for job in jobs}) == 1  # one batch wait for all kinds
    assert fray.wait_all(jobs, timeout=180) == [JobStatus.SUCCEEDED] * 3


def test_wait_all_raises_the_first_failure_while_others_still_run(ray_client, uid, tmp_path: Path) -> None:
    marker = tmp_path / "spinning"
    spinner = ray_client.submit(callable_job(f"spin-{uid}", spin, str(marker)))
    bad = ray_client.submit(callable_job(f"bad-{uid}", fail_first_attempt))
    try:
        with pytest.raises(RuntimeError) as info:
            fray.wait_all([spinner, bad], timeout=120)
        assert isinstance(info.value, JobFailed) and info.value.job_id == bad.job_id
        assert not spinner.status().finished
    finally:
        spinner.terminate()
    assert spinner.wait(timeout=60) == JobStatus.STOPPED


# ----- actors ----------------------------------------------------------------------------------


def test_actor_errors_carry_only_the_users_frames(ray_client, uid) -> None:
    actor = ray_client.create_actor(Lookup, name=f"lookup-{uid}")
    for call, frame in ((lambda: actor.find("k"), "in find"), (lambda: actor.get("k"), "in get")):
        with pytest.raises(LookupError) as info:
            call()
        err = info.value
        assert isinstance(err, RemoteError)
        assert err.traceback_text.startswith("Traceback (most recent call last):\n")
        assert frame in err.traceback_text
        for machinery in ("ray/_private", "_worker.py", "_eventloop.py", "concurrent/futures"):
            assert machinery not in err.traceback_text


def test_constructor_failure_is_actor_died_caused_by_the_users_exception(ray_client, uid) -> None:
    group = ray_client.create_actor_group(BrokenAtBirth, name=f"broken-{uid}", count=1)
    handle, job = only_member(group)
    died = handle._fray_ready().exception(timeout=60)
    assert isinstance(died, ActorDiedError)
    with pytest.raises(ActorDiedError) as call:
        handle.ping()
    for err in (died, call.value):
        cause = err.__cause__
        assert isinstance(cause, RemoteError) and isinstance(cause, ConfigMissing)
        assert "in __init__" in cause.traceback_text
    with pytest.raises(ConfigMissing) as info:
        job.wait(timeout=60)
    assert isinstance(info.value, JobFailed)
    assert info.value.message == "actor " + repr(f"broken-{uid}-0") + " did not start: ConfigMissing: no config file"


def only_member(group):
    """The handle and job of a one-member group, whether or not the member started."""
    return group._handles[0], group.jobs[0]


def test_actor_job_finishes_when_the_actor_dies_while_someone_waits(ray_client, uid) -> None:
    group = ray_client.create_actor_group(Lookup, name=f"mortal-{uid}", count=1)
    handle, job = only_member(group)
    handle._fray_ready().result(timeout=60)
    waited: list[JobStatus] = []
    waiter = threading.Thread(target=lambda: waited.append(job.wait(timeout=120, raise_on_failure=False)))
    waiter.start()
    ray.kill(handle._resolve(), no_restart=True)  # from outside Fray: only Ray knows the actor is gone
    waiter.join(timeout=150)
    assert waited == [JobStatus.FAILED]
    with pytest.raises(JobFailed, match="died"):
        job.wait(timeout=0)


class Sleeper:
    def pid(self) -> int:
        import os

        return os.getpid()

    def block(self, marker: str) -> None:
        Path(marker).write_text("running")
        while True:  # ends only with the process
            time.sleep(0.02)


def test_a_call_in_flight_when_a_restartable_actor_dies_is_always_actor_died(ray_client, uid, tmp_path: Path) -> None:
    # Ray words this two ways, by timing: "the actor was restarted" or, when the socket closes
    # before the GCS knows, "Socket closed ... temporarily unavailable" (4 in 10 kills here).
    # Both mean the instance the call went to is gone; a caller must see one error.
    from fray import ActorConfig
    from fray.testing import kill_actor

    group = ray_client.create_actor_group(
        Sleeper, name=f"sleeper-{uid}", count=1, actor_config=ActorConfig(max_restarts=10)
    )
    actor = group.wait_ready(timeout=120)[0]
    for attempt in range(6):
        before = actor.pid()
        marker = tmp_path / f"running-{attempt}"
        in_flight = actor.block.remote(str(marker))
        wait_until(marker.exists, timeout=120, what="the call to start")
        kill_actor(actor)
        with pytest.raises(ActorDiedError, match="died"):
            in_flight.result(timeout=120)
        wait_until(
            lambda before=before: _answers_from_another_process(actor, before), timeout=120, what="the restarted actor"
        )


def _answers_from_another_process(actor, before: int) -> bool:
    try:
        return actor.pid.remote().result(timeout=60) != before
    except (ActorDiedError, ActorUnavailableError):
        return False


HALF_THE_CLUSTER = ResourceConfig(cpu=RAY_TEST_CPUS // 2, ram="0b", disk="0b")


def _one(i: int) -> int:
    return i


def _parent_waiting_on_a_child(uid: str) -> None:
    client = fray.current_client()
    child = client.submit(
        JobRequest(f"child-{uid}", Entrypoint.from_callable(_one, args=(1,)), resources=HALF_THE_CLUSTER)
    )
    assert fray.wait_all([child], timeout=120) == [JobStatus.SUCCEEDED]


def test_parents_filling_the_ray_cluster_lend_their_cpus_to_the_children_they_wait_all_on(ray_client, uid) -> None:
    # Two parents take every CPU; Ray lends a task's CPUs only while its main thread blocks in ray.get/ray.wait,
    # so fray.wait_all inside a Ray job waits there (not on a Python condition) and the children can start.
    parents = [
        ray_client.submit(
            JobRequest(
                f"parent{i}-{uid}",
                Entrypoint.from_callable(_parent_waiting_on_a_child, args=(f"{i}-{uid}",)),
                resources=HALF_THE_CLUSTER,
            )
        )
        for i in range(2)
    ]
    assert fray.wait_all(parents, timeout=180) == [JobStatus.SUCCEEDED] * 2
