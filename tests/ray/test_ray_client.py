"""Ray-specific behaviour of RayClient, on the session's real local Ray (see tests/backends/ray.py)."""

from __future__ import annotations

import os
import pickle
import threading
import time
from pathlib import Path

import pytest

from fray import (
    ActorDiedError,
    ConfigError,
    Entrypoint,
    EnvironmentConfig,
    JobFailed,
    JobRequest,
    JobStatus,
    ResourceConfig,
    client_from_spec,
    current_client,
    current_job,
)
from support import alive, wait_until

ray = pytest.importorskip("ray", reason='the Ray backend needs Ray: pip install "fray[ray]"')


class Recorder:
    def __init__(self) -> None:
        self.items: list = []

    def add(self, item) -> int:
        self.items.append(item)
        return len(self.items)

    def get(self) -> list:
        return list(self.items)


class Fragile:
    def ping(self) -> str:
        return "pong"

    def die(self) -> None:
        os._exit(1)

    def fail(self) -> None:
        raise LookupError("the thing was not there")


class TaskFailure(Exception):
    """A user exception type that must come back as itself."""


def report_client(recorder) -> None:
    client = current_client()
    recorder.add((type(client).__name__, client.namespace))


def raise_task_failure() -> None:
    raise TaskFailure("boom in the job")


def write_pid_and_spin(path: str) -> None:
    Path(path + ".tmp").write_text(str(os.getpid()))
    os.replace(path + ".tmp", path)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # stopped by terminate() long before
        time.sleep(0.05)


def crash_worker_on_first_attempts(recorder, crashes: int) -> None:
    info = current_job()
    assert info is not None
    recorder.add(info.attempt)
    if info.attempt < crashes:
        os._exit(1)  # the worker process vanishes, as on a preempted VM


def call_every_member(group, recorder) -> None:
    for handle in group.wait_ready(timeout=60):
        recorder.add(handle.ping())


def job(name: str, fn, *args, **request_kwargs) -> JobRequest:
    return JobRequest(name=name, entrypoint=Entrypoint.from_callable(fn, args=args), **request_kwargs)


def test_spec_builds_a_client_on_the_running_cluster(ray_client, uid) -> None:
    client = client_from_spec(f"ray?namespace=spec-{uid}")
    try:
        assert type(client).__name__ == "RayClient"
        assert client.namespace == f"spec-{uid}"
        assert client.create_actor(Fragile, name="p").ping() == "pong"
    finally:
        client.shutdown()
    assert ray.is_initialized()  # the fixture made the connection, so it keeps it


def test_unknown_spec_option_lists_the_valid_forms(ray_client) -> None:
    with pytest.raises(ConfigError, match="valid forms"):
        client_from_spec("ray?colour=blue")


def test_current_client_in_a_job_is_a_ray_client_in_the_same_namespace(ray_client, uid) -> None:
    recorder = ray_client.create_actor(Recorder, name=f"rec-{uid}")
    ray_client.submit(job(f"who-{uid}", report_client, recorder)).wait(timeout=60)
    assert recorder.get() == [("RayClient", ray_client.namespace)]


def test_two_clients_keep_actor_names_apart_by_namespace(ray_client, uid) -> None:
    other = client_from_spec(f"ray?namespace=other-{uid}")
    try:
        a = ray_client.create_actor(Recorder, name="same-name")
        b = other.create_actor(Recorder, name="same-name")
        a.add("a")
        assert b.get() == []
    finally:
        other.shutdown()


def test_job_exception_keeps_its_type_and_remote_traceback(ray_client, uid) -> None:
    handle = ray_client.submit(job(f"fail-{uid}", raise_task_failure))
    with pytest.raises(JobFailed) as info:
        handle.wait(timeout=60)
    err = info.value
    assert isinstance(err, TaskFailure)  # the one error form: JobFailed and the user's class at once
    assert type(err.cause) is TaskFailure
    assert err.__cause__ is err.cause  # the original is the cause (Ray's and marin's rule)
    assert "raise_task_failure" in str(err.cause.__cause__)  # the remote traceback, chained under it
    assert not isinstance(err, ray.exceptions.RayError)


def test_actor_exception_is_the_users_type_not_rays(ray_client, uid) -> None:
    actor = ray_client.create_actor(Fragile, name=f"fragile-{uid}")
    with pytest.raises(LookupError) as info:
        actor.fail()
    assert not isinstance(info.value, ray.exceptions.RayError)
    assert isinstance(info.value.__cause__, LookupError)  # the original, with the remote traceback under it
    assert "in fail" in str(info.value.__cause__.__cause__)


def test_actor_process_death_is_actor_died_error(ray_client, uid) -> None:
    group = ray_client.create_actor_group(Fragile, name=f"mortal-{uid}", count=1)
    actor = group.wait_ready(timeout=60)[0]
    with pytest.raises(ActorDiedError):
        actor.die()
    with pytest.raises(ActorDiedError):
        actor.ping.remote().result(timeout=60)
    assert group.jobs[0].wait(timeout=60, raise_on_failure=False) == JobStatus.FAILED


def test_terminate_kills_the_process_running_a_callable_job(ray_client, uid, tmp_path: Path) -> None:
    pidfile = str(tmp_path / "pid")
    handle = ray_client.submit(job(f"spin-{uid}", write_pid_and_spin, pidfile))
    pid = int(wait_until(lambda: os.path.exists(pidfile) and Path(pidfile).read_text(), what="pid file"))
    wait_until(lambda: handle.status() == JobStatus.RUNNING, what="RUNNING")
    handle.terminate()
    assert handle.status() == JobStatus.STOPPED
    wait_until(lambda: not alive(pid), what=f"worker process {pid} to die")


def test_lost_worker_is_retried_under_the_preemption_budget(ray_client, uid) -> None:
    recorder = ray_client.create_actor(Recorder, name=f"rec-{uid}")
    handle = ray_client.submit(
        job(
            f"crash-{uid}", crash_worker_on_first_attempts, recorder, 1, max_retries_failure=0, max_retries_preemption=1
        )
    )
    assert handle.wait(timeout=90) == JobStatus.SUCCEEDED
    assert recorder.get() == [0, 1]


def test_lost_worker_without_preemption_budget_fails(ray_client, uid) -> None:
    recorder = ray_client.create_actor(Recorder, name=f"rec-{uid}")
    handle = ray_client.submit(
        job(
            f"crash0-{uid}",
            crash_worker_on_first_attempts,
            recorder,
            9,
            max_retries_failure=5,
            max_retries_preemption=0,
        )
    )
    with pytest.raises(JobFailed, match="lost its worker"):
        handle.wait(timeout=90)
    assert recorder.get() == [0]  # the failure budget is not spent on preemptions


def test_exceptions_do_not_spend_the_preemption_budget(ray_client, uid) -> None:
    handle = ray_client.submit(job(f"fail0-{uid}", raise_task_failure, max_retries_preemption=5))
    with pytest.raises(JobFailed) as info:
        handle.wait(timeout=60)
    # One attempt, no failure retries allowed: the plain reason, no "gave up after N attempts".
    assert info.value.message == "TaskFailure: boom in the job"


def test_replicas_that_cannot_all_fit_never_start(ray_client, uid, tmp_path: Path) -> None:
    pidfile = str(tmp_path / "pid")
    huge = ResourceConfig(cpu=5)  # two replicas need 10 CPUs; the test cluster has 8
    handle = ray_client.submit(job(f"gang-{uid}", write_pid_and_spin, pidfile, resources=huge, replicas=2))
    assert handle.status() == JobStatus.PENDING
    with pytest.raises(TimeoutError):
        handle.wait(timeout=1)
    assert not os.path.exists(pidfile)
    handle.terminate()
    assert handle.wait(timeout=30) == JobStatus.STOPPED


def test_actor_group_pickles_into_a_job(ray_client, uid) -> None:
    recorder = ray_client.create_actor(Recorder, name=f"rec-{uid}")
    group = ray_client.create_actor_group(Fragile, name=f"grp-{uid}", count=2)
    assert pickle.loads(pickle.dumps(group)).wait_ready(timeout=60)[0].ping() == "pong"
    ray_client.submit(job(f"use-group-{uid}", call_every_member, group, recorder)).wait(timeout=60)
    assert recorder.get() == ["pong", "pong"]


def test_binary_job_runs_in_its_workspace(ray_client, uid, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text(f"payload-{uid}\n")
    handle = ray_client.submit(
        JobRequest(
            name=f"ws-{uid}",
            entrypoint=Entrypoint.from_binary("cat", ["data.txt"]),
            environment=EnvironmentConfig(workspace=str(tmp_path)),
        )
    )
    assert handle.wait(timeout=90) == JobStatus.SUCCEEDED
    assert f"payload-{uid}" in wait_until(lambda: handle.logs(), what="logs")


class Slow:
    def __init__(self) -> None:
        import threading

        self.gate = threading.Event()

    def wait_for_gate(self) -> str:
        self.gate.wait(60)
        return "opened"

    def value(self, x: int) -> int:
        return x


def test_actor_futures_complete_for_callbacks_and_as_completed(ray_client, uid) -> None:
    import concurrent.futures

    a = ray_client.create_actor(Slow, name=f"slow-a-{uid}")
    b = ray_client.create_actor(Slow, name=f"slow-b-{uid}")
    futures = [a.value.remote(1), b.value.remote(2)]
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures, timeout=60)) == [1, 2]
    seen = []
    done = a.value.remote(3)
    done.add_done_callback(lambda f: seen.append(f.result()))
    wait_until(lambda: seen == [3], what="the done callback")


def test_actor_future_result_times_out_with_builtin_timeout_error(ray_client, uid) -> None:
    actor = ray_client.create_actor(Slow, name=f"gate-{uid}")
    pending = actor.wait_for_gate.remote()
    with pytest.raises(TimeoutError):
        pending.result(timeout=0.2)
    assert not pending.done()


def print_then_spin(path: str) -> None:
    print("hello while running", flush=True)
    write_pid_and_spin(path)


def test_logs_of_a_running_callable_job_come_from_rays_log_api(ray_client, uid, tmp_path: Path) -> None:
    pidfile = str(tmp_path / "pid")
    handle = ray_client.submit(job(f"live-{uid}", print_then_spin, pidfile))
    try:
        wait_until(lambda: handle.status() == JobStatus.RUNNING, what="RUNNING")
        wait_until(lambda: "hello while running" in handle.logs(), timeout=30, what="live log line")
    finally:
        handle.terminate()


def test_shutdown_leaves_no_fray_thread_calling_ray(ray_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # A user's script ends with client.shutdown(); ray.shutdown(). A Ray call still in flight on one of
    # Fray's threads when Ray shuts down ends the whole process, so shutdown() joins the threads it started.
    from fray.ray import RayClient
    from fray.ray.jobs import ActorJob

    look = ActorJob.status

    def slow_look(self: ActorJob) -> JobStatus:
        if threading.current_thread().name.startswith("fray-actor-"):
            time.sleep(2.0)  # the watcher's look at Ray takes a while: shutdown() must wait for it
        return look(self)

    monkeypatch.setattr(ActorJob, "status", slow_look)

    client = RayClient(namespace=f"reaper-{os.getpid()}-{time.monotonic_ns()}")
    actor_name = f"watched-{time.monotonic_ns()}"
    recorder = client.create_actor(Recorder, name=actor_name)
    assert recorder.add(1) == 1
    [actor_job] = client._actor_jobs.values()
    with pytest.raises(TimeoutError):
        actor_job.wait(timeout=0.05)  # someone waiting on the actor starts its watcher
    assert [t for t in threading.enumerate() if t.name == f"fray-actor-{actor_name}"]
    handles = [
        client.submit(JobRequest(name=f"quick-{i}", entrypoint=Entrypoint.from_callable(abs, args=(-i,))))
        for i in range(3)
    ]
    reaper = client._launcher._reaper
    assert reaper is not None, "a submitted job is watched by the reaper"
    for handle in handles:
        assert handle.wait(timeout=60) == JobStatus.SUCCEEDED
    client.shutdown()
    assert not reaper.is_alive(), "the reaper outlived shutdown() (it lingers 2 s between jobs otherwise)"
    watchers = [t.name for t in threading.enumerate() if t.name == f"fray-actor-{actor_name}"]
    assert watchers == [], "the actor's watcher outlived shutdown()"
