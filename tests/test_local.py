"""What is specific to the embedded local backend: threads, in-process limits, process cleanup."""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import weakref
from pathlib import Path

import pytest

import fray
from fray import (
    ActorDiedError,
    ActorUnavailableError,
    ConfigError,
    Entrypoint,
    EnvironmentConfig,
    FrayError,
    JobFailed,
    JobRequest,
    JobStatus,
    JobTerminated,
    SerializationError,
)
from fray.core.inside._runtime import StoppableRun, ThreadStopped
from fray.local import LocalClient, LocalJobHandle, MarinLocalClient
from support import alive, wait_until


def job(name: str, fn, *args, **request_kwargs) -> JobRequest:
    return JobRequest(name=name, entrypoint=Entrypoint.from_callable(fn, args=args), **request_kwargs)


class Gate:
    """Test-only events shared with in-process jobs (a local-backend privilege)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.barrier = threading.Barrier(2)

    def __reduce__(self):
        # Jobs on the local backend get the very object; submit() only checks that it pickles.
        return (Gate, ())

    def pass_through(self) -> None:
        self.entered.set()
        assert self.release.wait(30)


def test_thread_limit_keeps_extra_jobs_pending():
    client = LocalClient(max_threads=1)
    gate = Gate()
    first = client.submit(job("first", gate.pass_through))
    assert gate.entered.wait(10)
    second = client.submit(job("second", lambda: None))
    assert second.status() == JobStatus.PENDING
    gate.release.set()
    assert fray.wait_all([first, second], timeout=30) == [JobStatus.SUCCEEDED] * 2
    client.shutdown()


def test_a_job_of_a_better_band_waiting_for_a_thread_starts_before_earlier_jobs_of_a_worse_band():
    client = LocalClient(max_threads=1)
    gate = Gate()
    started: list[str] = []
    first = client.submit(job("first", gate.pass_through))
    assert gate.entered.wait(10)
    batch = [client.submit(job(f"batch{i}", started.append, f"batch{i}", priority=3)) for i in range(2)]
    interactive = client.submit(job("interactive", started.append, "interactive"))
    production = client.submit(job("production", started.append, "production", priority=1))
    waiting = [*batch, interactive, production]
    wait_until(lambda: all(j.info().pending_reason for j in waiting), what="the four jobs to wait for the thread")
    gate.release.set()
    assert fray.wait_all([first, *waiting], timeout=30) == [JobStatus.SUCCEEDED] * 5
    # Best band first; within a band, whichever the thread went to first.
    assert started[:2] == ["production", "interactive"] and sorted(started[2:]) == ["batch0", "batch1"]
    client.shutdown()


def _submit_children_and_wait(count: int, how: str) -> list[str]:
    client = fray.current_client()
    children = [client.submit(job(f"child{i}", lambda i=i: i)) for i in range(count)]
    if how == "wait_all":
        fray.wait_all(children, timeout=30)
    else:
        for child in children:
            child.wait(timeout=30)
    return [c.status().value for c in children]


@pytest.mark.parametrize("how", ["wait_all", "handle.wait"])
def test_a_job_waiting_on_its_children_lends_its_thread_so_they_run(how):
    # One thread: the parent holds it, and would wait for ever on children that cannot start.
    client = LocalClient(max_threads=1)
    parent = client.submit(job("parent", _submit_children_and_wait, 3, how))
    assert parent.wait(timeout=60) == JobStatus.SUCCEEDED
    client.shutdown()


def test_replicas_beyond_the_thread_limit_are_rejected_at_submit():
    client = LocalClient(max_threads=2)
    with pytest.raises(ConfigError, match="at most 2 threads"):
        client.submit(job("big", lambda: None, replicas=3))
    client.shutdown()


def test_terminated_callable_job_stops_at_its_next_fray_call(local_client):
    gate = Gate()

    def loop() -> None:
        gate.entered.set()
        try:
            while True:
                fray.current_job()
                gate.release.wait(0.005)  # the job's own pacing, not test synchronisation
        except JobTerminated:
            gate.release.set()
            raise

    handle = local_client.submit(job("looper", loop))
    assert gate.entered.wait(10)
    handle.terminate()
    assert handle.status() == JobStatus.STOPPED
    assert gate.release.wait(10)
    assert handle.wait(timeout=1) == JobStatus.STOPPED


class Spinner:
    """Shared with an in-process job: it spins in pure Python, never calling Fray, until stopped."""

    def __init__(self) -> None:
        self.count = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.after: list[str] = []

    def __reduce__(self):
        return (Spinner, ())

    def spin(self) -> None:
        self.entered.set()
        while True:
            self.count += 1

    def mark(self) -> None:
        self.entered.set()

    def block_in_c(self) -> None:
        self.entered.set()
        self.release.wait()  # one C-level wait: an asynchronous exception cannot land inside it
        self.after.append("ran on after the wait")


def threads_named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def test_terminate_stops_a_pure_python_loop_before_it_returns(local_client):
    spinner = Spinner()
    handle = local_client.submit(job("spin", spinner.spin, replicas=2))
    assert spinner.entered.wait(10)
    wait_until(lambda: spinner.count > 1000, what="the loop to spin")
    handle.terminate()
    assert handle.status() == JobStatus.STOPPED
    assert threads_named(f"fray-{handle.job_id}-r") == []  # every replica thread has exited
    count = spinner.count
    assert spinner.count == count


def test_a_thread_in_a_long_c_call_stops_when_the_call_returns(local_client, monkeypatch):
    monkeypatch.setattr("fray.local._local_job.STOP_GRACE", 0.2)
    spinner = Spinner()
    handle = local_client.submit(job("blocked", spinner.block_in_c))
    assert spinner.entered.wait(10)
    handle.terminate()  # returns after the grace: the thread cannot be interrupted inside the wait
    assert handle.status() == JobStatus.STOPPED  # final when terminate() returns, as on every backend
    assert threads_named(f"fray-{handle.job_id}-r") != []  # ... while the thread is still inside the C call
    spinner.release.set()
    wait_until(lambda: threads_named(f"fray-{handle.job_id}-r") == [], what="the thread to exit")
    assert handle.wait(timeout=30) == JobStatus.STOPPED
    assert spinner.after == []  # the exception landed as soon as the C call returned


def test_a_stop_never_lands_in_the_next_run_on_the_same_thread():
    # One thread runs job after job, each under its own StoppableRun, the way a reused thread
    # would; every other run is stopped just as it may be ending. A stop that arrives late must
    # neither reach the next run nor escape into the code between runs. Switching threads
    # every microsecond makes the stops land all over the runs' ends.
    total = 2000
    runs = [StoppableRun() for _ in range(total)]
    started = [threading.Event() for _ in range(total)]
    wrong: list[str] = []
    stopped: list[int] = []
    finished: list[int] = []

    def body(i: int) -> None:
        started[i].set()
        x = 0
        for k in range(50 * (i % 7)):
            x += k

    def worker() -> None:
        for i, run in enumerate(runs):
            try:
                try:
                    run.run(body, i)
                except ThreadStopped:
                    stopped.append(i)
                finished.append(i)
            except ThreadStopped:
                wrong.append(f"a stop escaped run {i}")

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        for i in range(0, total, 2):
            assert started[i].wait(30), f"the worker died after {len(finished)} runs: {wrong}"
            runs[i].stop()
        thread.join(60)
    finally:
        sys.setswitchinterval(previous)
    assert wrong == []
    assert [i for i in stopped if i % 2] == []  # only the runs that were stopped saw a stop
    assert stopped  # and some were stopped, mid-run
    assert finished == list(range(total))


def test_terminated_jobs_leave_nothing_behind_for_later_jobs(local_client):
    errors: list[threading.ExceptHookArgs] = []
    previous = threading.excepthook
    threading.excepthook = errors.append
    try:
        for i in range(20):
            spinner = Spinner()
            handle = local_client.submit(job(f"short-{i}", spinner.mark))
            assert spinner.entered.wait(10)
            handle.terminate()  # races with the job ending on its own
            assert handle.wait(timeout=30) in (JobStatus.STOPPED, JobStatus.SUCCEEDED)
            later = local_client.submit(job(f"later-{i}", lambda: sum(range(1000))))
            assert later.wait(timeout=30) == JobStatus.SUCCEEDED
    finally:
        threading.excepthook = previous
    assert errors == []


def test_wait_some_returns_when_one_job_finishes_or_the_timeout_passes(local_client):
    gates = [Gate(), Gate()]
    handles = [local_client.submit(job(f"gated-{i}", gate.pass_through)) for i, gate in enumerate(gates)]
    assert all(gate.entered.wait(10) for gate in gates)
    assert LocalJobHandle._fray_wait_some(handles, 0.05) == [JobStatus.RUNNING] * 2
    gates[1].release.set()
    assert LocalJobHandle._fray_wait_some(handles, None) == [JobStatus.RUNNING, JobStatus.SUCCEEDED]
    gates[0].release.set()
    assert fray.wait_all(handles, timeout=30) == [JobStatus.SUCCEEDED] * 2


def test_concurrent_jobs_keep_separate_logs(local_client):
    gate = Gate()

    def chatter(tag: str) -> None:
        gate.barrier.wait(10)
        for i in range(50):
            print(f"{tag} {i}")

    a = local_client.submit(job("a", chatter, "alpha"))
    b = local_client.submit(job("b", chatter, "beta"))
    fray.wait_all([a, b], timeout=30)
    assert a.logs() == tuple(f"alpha {i}" for i in range(50))
    assert b.logs() == tuple(f"beta {i}" for i in range(50))


def test_docker_image_is_noted_as_ignored(local_client):
    env = EnvironmentConfig(docker_image="ghcr.io/acme/train:1")
    handle = local_client.submit(job("dock", lambda: None, environment=env))
    handle.wait(timeout=10)
    assert any("ignores docker_image" in line for line in handle.logs())


def test_missing_pip_package_is_reported_at_submit(local_client):
    env = EnvironmentConfig(pip_packages=["numpy", "surely-not-installed-pkg>=1"])
    with pytest.raises(ConfigError, match="surely-not-installed-pkg"):
        local_client.submit(job("pkgs", lambda: None, environment=env))


def test_conflicting_env_vars_of_concurrent_jobs_fail_loudly(local_client):
    gate = Gate()
    first = local_client.submit(job("one", gate.pass_through, environment=EnvironmentConfig(env_vars={"FRAY_X": "1"})))
    assert gate.entered.wait(10)
    second = local_client.submit(job("two", lambda: None, environment=EnvironmentConfig(env_vars={"FRAY_X": "2"})))
    with pytest.raises(JobFailed) as info:
        second.wait(timeout=10)
    assert isinstance(info.value.cause, ConfigError)
    assert os.environ["FRAY_X"] == "1"
    gate.release.set()
    first.wait(timeout=10)
    assert "FRAY_X" not in os.environ


def test_terminate_kills_children_of_a_binary_job(local_client, tmp_path: Path):
    pidfile = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; wait"
    handle = local_client.submit(JobRequest(name="tree", entrypoint=Entrypoint.from_binary("bash", ["-c", script])))
    child = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), what="child pid"))
    handle.terminate()
    wait_until(lambda: not alive(child), what="the grandchild to die")


def test_binary_jobs_know_who_they_are(local_client):
    code = "import fray, os; i = fray.current_job(); print(i.name, i.replica_index, i.replica_count, os.environ['FRAY_CLIENT_SPEC'])"
    handle = local_client.submit(
        JobRequest(name="whoami", entrypoint=Entrypoint.from_binary(sys.executable, ["-c", code]), replicas=2)
    )
    handle.wait(timeout=60)
    assert sorted(handle.logs()) == ["whoami 0 2 local", "whoami 1 2 local"]


class Slow:
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()

    def block(self) -> str:
        self.entered.set()
        while not self.gate.wait(0.01):  # short waits: a terminated actor's thread stops between them
            pass
        return "done"

    def quick(self) -> str:
        return "quick"

    def unblock(self) -> None:
        self.gate.set()


def test_queued_calls_fail_when_the_actor_is_terminated(local_client):
    group = local_client.create_actor_group(Slow, name="slow", count=1)
    actor = group.wait_ready(timeout=10)[0]
    running = actor.block.remote()
    queued = actor.quick.remote()
    assert wait_until(lambda: not queued.done() and running.running(), what="the first call to start")
    group.shutdown()
    with pytest.raises(ActorDiedError):
        running.result(timeout=10)
    with pytest.raises(ActorDiedError):
        queued.result(timeout=10)


class Looper:
    def __init__(self) -> None:
        self.count = 0
        self.history: list[object] = []

    def spin(self) -> None:
        while True:
            self.count += 1

    async def tick(self) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(0.001)

    def read(self) -> int:
        return self.count

    def echo(self, value: object) -> object:
        self.history.append(value)
        return value

    def calls(self) -> list[object]:
        return list(self.history)


@pytest.mark.parametrize("method", ["spin", "tick"])
def test_terminating_an_actor_stops_its_threads(local_client, method):
    group = local_client.create_actor_group(Looper, name=f"looper-{method}", count=1)
    actor = group.wait_ready(timeout=30)[0]
    running = getattr(actor, method).remote()
    wait_until(lambda: running.running(), what="the call to start")
    group.shutdown()
    with pytest.raises(ActorDiedError):
        running.result(timeout=10)
    assert group.jobs[0].wait(timeout=30) == JobStatus.STOPPED
    assert threads_named(f"fray-actor-looper-{method}") == []
    assert threads_named(f"fray-actor-loop-looper-{method}") == []


def test_unpicklable_actor_arguments_are_refused_before_anything_is_queued(local_client):
    actor = local_client.create_actor(Looper, name="checked")
    with pytest.raises(SerializationError) as info:
        actor.echo([threading.Lock()])  # hidden inside a list: still refused
    assert str(info.value).startswith("actor 'checked', method 'echo': argument 0 cannot be pickled")
    with pytest.raises(SerializationError, match="keyword argument 'value'"):
        actor.echo.remote(value={"lock": threading.Lock()})
    assert actor.calls() == []


class Tagged(int):
    """An int subclass: its instances may carry attributes that do not pickle."""


@pytest.mark.parametrize(
    "value",
    [
        [list(range(100)), threading.Lock()],  # past the part looked at without pickling
        {"deep": [[[("x", threading.Lock())]]]},
        Tagged(1),
    ],
    ids=["after-a-long-list", "nested", "int-subclass"],
)
def test_plain_data_fast_path_still_refuses_what_does_not_pickle(local_client, value):
    if isinstance(value, Tagged):
        value.lock = threading.Lock()
    actor = local_client.create_actor(Looper, name="fast-path")
    with pytest.raises(SerializationError, match="argument 0 cannot be pickled"):
        actor.echo(value)
    assert actor.echo([1, 2.5, "x", b"y", None, (True, {"k": frozenset({3})})]) == [
        1,
        2.5,
        "x",
        b"y",
        None,
        (True, {"k": frozenset({3})}),
    ]


def test_handles_pickle_within_the_process(local_client):
    counter = local_client.create_actor(Slow, name="pickled")
    copy = pickle.loads(pickle.dumps(counter))
    assert copy.quick() == "quick"


def test_handles_unpickled_in_another_process_say_why_they_cannot_work(local_client, tmp_path: Path):
    counter = local_client.create_actor(Slow, name="elsewhere")
    blob = tmp_path / "handle.pkl"
    blob.write_bytes(pickle.dumps(counter))
    code = textwrap.dedent(
        f"""
        import pickle, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from fray import ActorUnavailableError
        handle = pickle.loads(open({str(blob)!r}, 'rb').read())
        try:
            handle.quick()
        except ActorUnavailableError as exc:
            print("unavailable:", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "unavailable:" in out.stdout, out.stderr
    assert "only work in the process that created them" in out.stdout
    assert issubclass(ActorUnavailableError, FrayError)


def test_shutdown_waits_for_running_jobs_then_refuses_work():
    client = LocalClient()
    gate = Gate()
    handle = client.submit(job("busy", gate.pass_through))
    assert gate.entered.wait(10)
    threading.Timer(0.05, gate.release.set).start()
    client.shutdown(wait=True)
    assert handle.status() == JobStatus.SUCCEEDED
    with pytest.raises(FrayError, match="shut down"):
        client.submit(job("late", lambda: None))


def test_leaving_the_with_block_on_error_stops_running_work(tmp_path: Path):
    with pytest.raises(RuntimeError), LocalClient() as client:
        handle = client.submit(JobRequest(name="s", entrypoint=Entrypoint.from_binary("sleep", ["300"])))
        wait_until(lambda: handle.status() == JobStatus.RUNNING, what="the job to start")
        raise RuntimeError("user code failed")
    assert handle.wait(timeout=10) == JobStatus.STOPPED


def test_no_subprocess_outlives_the_interpreter(tmp_path: Path):
    pidfile = tmp_path / "pid"
    script = textwrap.dedent(
        f"""
        import pathlib, time
        from fray import Entrypoint, JobRequest
        from fray.local import LocalClient, LocalJobHandle
        client = LocalClient()
        client.submit(JobRequest(name="orphan", entrypoint=Entrypoint.from_binary(
            "bash", ["-c", "echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; exec sleep 300"])))
        deadline = time.monotonic() + 30
        while not pathlib.Path({str(pidfile)!r}).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    pid = int(pidfile.read_text())
    wait_until(lambda: not alive(pid), what="the orphaned job process to be killed")


# ----- values: the very objects, checked to pickle (seed 003: the local backend "calls methods directly") -----


def _lock_held_by_the_caller(lock: threading.Lock) -> bool:
    return lock.locked()


@pytest.mark.parametrize(
    "make", [lambda: LocalClient(check_pickling=False), MarinLocalClient], ids=["opt-out", "marin"]
)
def test_without_the_check_jobs_and_actors_get_the_very_objects_unpickled(make):
    lock = threading.Lock()
    with lock, make() as client:
        handle = client.submit(job("same-lock", _lock_held_by_the_caller, lock))
        assert handle.wait(timeout=30, raise_on_failure=True) == JobStatus.SUCCEEDED
        actor = client.create_actor(Looper, name="unpickled")
        assert actor.echo(lock) is lock  # argument and return value are the caller's own object
        assert actor.calls() == [lock]


def test_by_default_local_refuses_what_another_backend_could_not_ship():
    for client in (LocalClient(), fray.client_from_spec("local"), fray.client_from_spec("local?pickle=1")):
        with client:
            assert client.check_pickling
            with pytest.raises(SerializationError, match="argument 0 cannot be pickled"):
                client.submit(job("locked", _lock_held_by_the_caller, threading.Lock()))
            actor = client.create_actor(Looper, name="checked-args")
            with pytest.raises(SerializationError, match="argument 0 cannot be pickled"):
                actor.echo(threading.Lock())
            assert actor.calls() == []
    with fray.client_from_spec("local?threads=2&pickle=0") as unchecked:
        assert not unchecked.check_pickling
    with MarinLocalClient() as marins:  # marin's local rule: values are never pickled
        assert not marins.check_pickling
    with pytest.raises(ConfigError, match="pickle='yes' must be 1"):
        fray.client_from_spec("local?pickle=yes")


def test_finished_jobs_are_not_kept_with_their_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each LocalJob holds its captured output and its lifecycle: a client that kept every one would grow
    # without bound in a driver that submits many short jobs.
    from fray.core._owned import OwnedWork

    monkeypatch.setattr(OwnedWork, "SWEEP_AT", 4)
    monkeypatch.setenv("FRAY_PENDING_NOTICE_SECONDS", "off")
    with LocalClient() as client:
        handle = client.submit(job("talker", print, "x" * 1000))
        assert handle.wait(timeout=60) == JobStatus.SUCCEEDED
        let_go = weakref.ref(handle._job)
        del handle
        for i in range(2 * OwnedWork.SWEEP_AT):
            assert client.submit(job(f"quiet-{i}", abs, -i)).wait(timeout=60) == JobStatus.SUCCEEDED
        wait_until(lambda: gc.collect() >= 0 and let_go() is None, timeout=30, what="the finished job to be let go")
