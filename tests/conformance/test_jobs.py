"""Job behaviour every backend must show."""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

import fray
from fray import (
    ConfigError,
    Entrypoint,
    EnvironmentConfig,
    JobFailed,
    JobRequest,
    JobStatus,
    JobTimeout,
    SerializationError,
    current_client,
    current_job,
    wait_all,
)
from fray.core._owned import OwnedWork
from support import alive, wait_until


class Recorder:
    """An actor that jobs report to, so tests can observe what ran in other processes."""

    def __init__(self) -> None:
        self.items: list = []

    def add(self, item) -> int:
        self.items.append(item)
        return len(self.items)

    def get(self) -> list:
        return list(self.items)


def add_numbers(a: int, b: int = 0) -> int:
    return a + b


def fail_with_value_error(message: str) -> None:
    raise ValueError(message)


def report_identity(recorder) -> None:
    info = current_job()
    assert info is not None
    recorder.add((info.job_id, info.name, info.replica_index, info.replica_count, info.attempt))


def fail_until_attempt(recorder, succeed_on: int) -> None:
    info = current_job()
    assert info is not None
    recorder.add(info.attempt)
    if info.attempt < succeed_on:
        raise RuntimeError(f"attempt {info.attempt} fails on purpose")


def replica_one_fails() -> None:
    info = current_job()
    assert info is not None
    if info.replica_index == 1:
        raise RuntimeError("replica 1 fails on purpose")


def print_lines(count: int) -> None:
    for i in range(count):
        print(f"line {i}")
    sys.stdout.flush()


def submit_child_and_wait(recorder) -> None:
    client = current_client()
    child = client.submit(
        JobRequest(name="child", entrypoint=Entrypoint.from_callable(report_identity, args=(recorder,)))
    )
    assert child.wait(timeout=60) == JobStatus.SUCCEEDED
    parent = current_job()
    assert parent is not None
    recorder.add(("parent", parent.job_id, child.job_id))


def loop_forever() -> None:
    while True:
        fray.current_job()  # the local backend stops a terminated thread at its next Fray call
        threading.Event().wait(0.01)


def read_env(recorder, name: str) -> None:
    recorder.add(os.environ.get(name))


class Baggage:
    """An argument a test can tell is still referenced (weakly referable, unlike bytes)."""

    def __init__(self) -> None:
        self.data = bytes(1000)


def weigh(baggage: Baggage) -> int:
    return len(baggage.data)


def callable_job(name: str, fn, *args, **kwargs) -> JobRequest:
    return JobRequest(name=name, entrypoint=Entrypoint.from_callable(fn, args=args, kwargs=kwargs))


def shell_job(name: str, script: str, **request_kwargs) -> JobRequest:
    return JobRequest(name=name, entrypoint=Entrypoint.from_binary("bash", ["-c", script]), **request_kwargs)


def test_callable_job_succeeds_and_its_id_names_it(client, uid):
    job = client.submit(callable_job(f"add-{uid}", add_numbers, 1, b=2))
    assert f"add-{uid}" in job.job_id
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    assert job.status() == JobStatus.SUCCEEDED
    assert job.status().finished


def test_failing_callable_raises_job_failed_with_original_exception(client, uid):
    job = client.submit(callable_job(f"fail-{uid}", fail_with_value_error, "the widget broke"))
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=60)
    err = info.value
    assert isinstance(err.cause, ValueError)
    assert "the widget broke" in str(err.cause)
    assert "fail_with_value_error" in err.traceback_text
    assert job.wait(timeout=60, raise_on_failure=False) == JobStatus.FAILED


def test_binary_job_output_is_in_its_logs(client, uid):
    job = client.submit(shell_job(f"echo-{uid}", "echo hello-from-binary; echo second line >&2"))
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    lines = wait_until(lambda: job.logs() if "second line" in job.logs() else None, what="logs")
    assert "hello-from-binary" in lines
    assert job.logs(max_lines=1) == lines[-1:]
    # marin's form on every backend: a tuple of lines, max_lines=0 meaning every line.
    assert isinstance(lines, tuple) and job.logs(max_lines=0) == lines
    with pytest.raises(fray.ConfigError, match="max_lines"):
        job.logs(max_lines=-1)


def test_binary_job_nonzero_exit_fails_with_exit_code(client, uid):
    job = client.submit(shell_job(f"exit3-{uid}", "echo about to fail; exit 3"))
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=60)
    assert info.value.exit_code == 3


def test_callable_job_prints_are_captured_in_logs(client, uid):
    job = client.submit(callable_job(f"print-{uid}", print_lines, 5))
    job.wait(timeout=60)
    logs = wait_until(lambda: job.logs() if "line 4" in job.logs() else None, what="logs")
    assert [line for line in logs if line.startswith("line ")] == [f"line {i}" for i in range(5)]
    assert job.logs(max_lines=2)[-1] == "line 4"


def print_without_newline() -> None:
    print("first line")
    sys.stdout.write("last words, no newline")
    sys.stdout.flush()


def test_a_binary_jobs_last_partial_line_is_kept(client, uid):
    job = client.submit(shell_job(f"partial-{uid}", "echo first line; printf 'last words, no newline'"))
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    logs = wait_until(lambda: job.logs() if any("last words" in line for line in job.logs()) else None, what="logs")
    assert logs[-2:] == ("first line", "last words, no newline"), logs


def test_a_callable_jobs_last_partial_line_is_kept(client, uid):
    job = client.submit(callable_job(f"partial-{uid}", print_without_newline))
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    logs = wait_until(lambda: job.logs() if any("last words" in line for line in job.logs()) else None, what="logs")
    assert [line for line in logs if line in ("first line", "last words, no newline")] == [
        "first line",
        "last words, no newline",
    ], logs


def test_replicas_each_see_their_own_index(client, uid):
    recorder = client.create_actor(Recorder, name=f"rec-{uid}")
    job = client.submit(
        JobRequest(
            name=f"rep-{uid}", entrypoint=Entrypoint.from_callable(report_identity, args=(recorder,)), replicas=3
        )
    )
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    seen = recorder.get()
    assert sorted(item[2] for item in seen) == [0, 1, 2]
    assert {item[3] for item in seen} == {3}
    assert {item[0] for item in seen} == {job.job_id}
    assert {item[1] for item in seen} == {f"rep-{uid}"}


def test_job_fails_if_any_replica_fails(client, uid):
    job = client.submit(
        JobRequest(name=f"rep-fail-{uid}", entrypoint=Entrypoint.from_callable(replica_one_fails), replicas=2)
    )
    with pytest.raises(JobFailed) as info:
        job.wait(timeout=60)
    assert "replica 1 fails on purpose" in str(info.value)


def test_retries_rerun_a_failing_job_until_it_succeeds(client, uid):
    recorder = client.create_actor(Recorder, name=f"rec-{uid}")
    job = client.submit(
        JobRequest(
            name=f"retry-{uid}",
            entrypoint=Entrypoint.from_callable(fail_until_attempt, args=(recorder, 2)),
            max_retries_failure=2,
        )
    )
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    assert recorder.get() == [0, 1, 2]


def test_marins_max_task_failures_is_the_failure_budget(client, uid):
    # marin's JobRequest(max_task_failures=N): N failures tolerated, the same budget as max_retries_failure.
    recorder = client.create_actor(Recorder, name=f"rec-{uid}")
    job = client.submit(
        JobRequest(
            name=f"task-failures-{uid}",
            entrypoint=Entrypoint.from_callable(fail_until_attempt, args=(recorder, 2)),
            max_task_failures=2,
        )
    )
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    assert recorder.get() == [0, 1, 2]


def test_retry_budget_is_respected(client, uid):
    recorder = client.create_actor(Recorder, name=f"rec-{uid}")
    job = client.submit(
        JobRequest(
            name=f"retry-out-{uid}",
            entrypoint=Entrypoint.from_callable(fail_until_attempt, args=(recorder, 5)),
            max_retries_failure=1,
        )
    )
    with pytest.raises(JobFailed):
        job.wait(timeout=60)
    assert recorder.get() == [0, 1]


def test_terminate_kills_a_binary_job_and_its_process(client, uid, tmp_path: Path):
    pidfile = tmp_path / "pid"
    job = client.submit(
        shell_job(f"sleeper-{uid}", f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; exec sleep 300")
    )
    pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the job's pid file"))
    assert job.status() == JobStatus.RUNNING
    job.terminate()
    assert job.wait(timeout=30) == JobStatus.STOPPED
    wait_until(lambda: not alive(pid), what=f"process {pid} to die")


def test_terminate_stops_a_running_callable_job(client, uid):
    job = client.submit(callable_job(f"loop-{uid}", loop_forever))
    wait_until(lambda: job.status() == JobStatus.RUNNING, what="the job to start")
    job.terminate()
    assert job.status() == JobStatus.STOPPED  # terminal once terminate() returns (marin's rule)
    assert job.wait(timeout=60) == JobStatus.STOPPED
    assert job.status() == JobStatus.STOPPED


def sleep_in_c(seconds: float) -> None:
    time.sleep(seconds)  # one C call: nothing interrupts it between Python instructions


def test_terminate_leaves_the_status_terminal_when_it_returns(client, uid):
    # Even a job blocked inside one C call, and a binary, read STOPPED the moment terminate() returns.
    blocked = client.submit(callable_job(f"blocked-{uid}", sleep_in_c, 300))
    binary = client.submit(shell_job(f"bin-{uid}", "exec sleep 300"))
    wait_until(lambda: blocked.status() == binary.status() == JobStatus.RUNNING, what="both jobs to start")
    for job in (blocked, binary):
        job.terminate()
        assert job.status() == JobStatus.STOPPED
        assert job.wait(timeout=60) == JobStatus.STOPPED


def test_terminate_after_success_changes_nothing(client, uid):
    job = client.submit(callable_job(f"done-{uid}", add_numbers, 1))
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    job.terminate()
    assert job.status() == JobStatus.SUCCEEDED
    assert job.wait(timeout=0) == JobStatus.SUCCEEDED


def test_jobs_accept_fractional_cpu_and_small_memory(client, uid):
    request = JobRequest(
        name=f"small-{uid}",
        entrypoint=Entrypoint.from_callable(add_numbers, args=(1,)),
        resources=fray.ResourceConfig(cpu=0.5, ram="64m"),
    )
    assert client.submit(request).wait(timeout=60) == JobStatus.SUCCEEDED


def test_wait_with_timeout_raises_timeout_error(client, uid):
    job = client.submit(shell_job(f"slow-{uid}", "exec sleep 300"))
    try:
        with pytest.raises(TimeoutError):
            job.wait(timeout=0.2)
        assert not job.status().finished
    finally:
        job.terminate()


def test_wait_all_returns_statuses_in_input_order(client, uid):
    jobs = [client.submit(callable_job(f"all-{i}-{uid}", add_numbers, i)) for i in range(4)]
    assert wait_all(jobs, timeout=60) == [JobStatus.SUCCEEDED] * 4
    assert wait_all([]) == []


def test_wait_all_raises_as_soon_as_any_job_fails(client, uid):
    slow = client.submit(shell_job(f"slow-{uid}", "exec sleep 300"))
    failing = client.submit(callable_job(f"fails-{uid}", fail_with_value_error, "early failure"))
    try:
        with pytest.raises(JobFailed) as info:
            wait_all([slow, failing], timeout=60)
        assert "early failure" in str(info.value)
        assert not slow.status().finished  # wait_all did not wait for the slow job
        statuses = wait_all([failing], raise_on_failure=False, timeout=60)
        assert statuses == [JobStatus.FAILED]
    finally:
        slow.terminate()


def test_wait_all_times_out(client, uid):
    slow = client.submit(shell_job(f"slow-{uid}", "exec sleep 300"))
    try:
        with pytest.raises(TimeoutError):
            wait_all([slow], timeout=0.2)
    finally:
        slow.terminate()


def test_job_can_submit_child_jobs_through_current_client(client, uid):
    recorder = client.create_actor(Recorder, name=f"rec-{uid}")
    job = client.submit(callable_job(f"parent-{uid}", submit_child_and_wait, recorder))
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED
    items = recorder.get()
    child_identity = next(i for i in items if i[0] != "parent")
    _, parent_id, child_id = next(i for i in items if i[0] == "parent")
    assert parent_id == job.job_id
    assert child_identity[0] == child_id
    assert child_identity[1] == "child"


def test_environment_variables_reach_the_job(client, uid):
    env = EnvironmentConfig(env_vars={"FRAY_TEST_COLOUR": f"blue-{uid}"})
    binary = client.submit(shell_job(f"env-bin-{uid}", 'echo "colour=$FRAY_TEST_COLOUR"', environment=env))
    binary.wait(timeout=60)
    wait_until(lambda: f"colour=blue-{uid}" in binary.logs(), what="env var in logs")
    recorder = client.create_actor(Recorder, name=f"rec-{uid}")
    job = client.submit(
        JobRequest(
            name=f"env-py-{uid}",
            entrypoint=Entrypoint.from_callable(read_env, args=(recorder, "FRAY_TEST_COLOUR")),
            environment=env,
        )
    )
    job.wait(timeout=60)
    assert recorder.get() == [f"blue-{uid}"]


def test_unpicklable_argument_is_rejected_at_submit(client, uid):
    with pytest.raises(SerializationError) as info:
        client.submit(callable_job(f"bad-{uid}", add_numbers, threading.Lock()))
    assert "argument 0" in str(info.value)


def test_current_job_is_none_outside_jobs():
    assert fray.current_job() is None


@pytest.mark.parametrize("detached", [True, False])
def test_a_client_keeps_no_finished_job_its_caller_let_go(client, uid, monkeypatch, detached: bool):
    # A driver that submits a million short jobs must not hold a million requests (arguments, logs)
    # for the client's life: the client forgets finished jobs as its records grow (fray.core._owned).
    monkeypatch.setattr(OwnedWork, "SWEEP_AT", 4)  # a sweep after a few jobs instead of hundreds
    monkeypatch.setenv("FRAY_PENDING_NOTICE_SECONDS", "off")  # the notice holds each job for its first 10 s
    baggage = Baggage()
    let_go = weakref.ref(baggage)
    handle = client.submit(callable_job(f"heavy-{uid}", weigh, baggage), detached=detached)
    assert handle.wait(timeout=120) == JobStatus.SUCCEEDED
    del handle, baggage
    for i in range(2 * OwnedWork.SWEEP_AT):
        later = client.submit(callable_job(f"light-{uid}-{i}", add_numbers, i), detached=detached)
        assert later.wait(timeout=120) == JobStatus.SUCCEEDED
    wait_until(lambda: gc.collect() >= 0 and let_go() is None, timeout=30, what="the finished job to be let go")


def test_submit_many_starts_every_job_and_returns_their_handles_in_order(client, uid):
    requests = [callable_job(f"many{i}-{uid}", print_lines, i + 1) for i in range(3)]
    jobs = client.submit_many(requests)
    assert [f"many{i}-{uid}" in job.job_id for i, job in enumerate(jobs)] == [True, True, True]
    assert fray.wait_all(jobs, timeout=120) == [JobStatus.SUCCEEDED] * 3
    assert [len(job.logs()) for job in jobs] == [1, 2, 3]


def test_submit_many_refuses_the_whole_call_for_one_bad_request(client, uid):
    good = callable_job(f"fine-{uid}", print_lines, 1)
    owned = len(client._owned_work()[0])
    with pytest.raises(ConfigError, match="submit_many\\(\\) takes JobRequests"):
        client.submit_many([good, "not a request"])
    assert len(client._owned_work()[0]) == owned  # nothing of the refused call started


def sleep_in_steps(seconds: float) -> None:
    # Short sleeps: a job run as a thread is stopped between two of them (a long C call ends first).
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["callable", "binary"])
def test_a_job_running_past_its_timeout_is_stopped_and_fails_with_job_timeout(client, uid, kind):
    entrypoint = (
        Entrypoint.from_callable(sleep_in_steps, args=(120,))
        if kind == "callable"
        else Entrypoint.from_binary(sys.executable, ["-c", "import time; time.sleep(120)"])
    )
    request = JobRequest(name=f"late-{kind}-{uid}", entrypoint=entrypoint, timeout=2, max_retries_failure=3)
    if "JobRequest.timeout" not in type(client).HONOURS:
        with pytest.raises(ConfigError, match=r"JobRequest\.timeout"):
            client.submit(request)
        return
    job = client.submit(request)
    with pytest.raises(JobTimeout, match="timeout of 2s") as info:
        job.wait(timeout=90)  # far less than the job's 120 s: it was stopped, not run out
    assert isinstance(info.value, JobFailed) and info.value.timeout == 2
    assert job.status() == JobStatus.FAILED  # final: the failure budget does not retry a timeout


def test_a_job_that_ends_within_its_timeout_succeeds(client, uid):
    request = JobRequest(name=f"prompt-{uid}", entrypoint=Entrypoint.from_callable(print, args=("done",)), timeout=120)
    if "JobRequest.timeout" not in type(client).HONOURS:
        with pytest.raises(ConfigError, match=r"JobRequest\.timeout"):
            client.submit(request)
        return
    assert client.submit(request).wait(timeout=120) == JobStatus.SUCCEEDED
