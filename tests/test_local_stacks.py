"""Live stacks on the local backend's process engine, and the stack server itself (fray.core.inside._stacks).

The conformance suite (tests/conformance/test_stacks.py) covers what every backend does; this
covers what only processes on this machine do: replicas run as processes (``processes_per_task``),
``ProcessJobContext`` tasks, a process that does not answer, fork children, and the server's
private directory.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fray import Entrypoint, FrameInfo, JobRequest, ProcessJobContext, ProcessStacks
from fray.context import set_job_context
from fray.core.inside import _stacks
from fray.local import LocalClient
from support import wait_until


def deep_sleep(stop: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not os.path.exists(stop):
        time.sleep(0.05)


def inner_wait(stop: str) -> str:
    deep_sleep(stop)
    return "done"


def uses_processes(stop: str) -> None:
    context = ProcessJobContext(num_workers=1)
    set_job_context(context)
    try:
        context.get(context.create_task(inner_wait, stop))
    finally:
        context.shutdown()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0]


def showing(stacks: tuple[ProcessStacks, ...], function: str) -> list[ProcessStacks]:
    return [p for p in stacks if any(f.function == function for t in p.threads for f in t.frames)]


@pytest.fixture
def client():
    with LocalClient() as local:
        yield local


def test_each_process_of_a_replica_shows_its_stack(client, tmp_path):
    stop = tmp_path / "stop"
    job = client.submit(
        JobRequest(
            name="ranks",
            entrypoint=Entrypoint.from_callable(deep_sleep, args=(str(stop),)),
            replicas=2,
            processes_per_task=2,
        )
    )
    try:

        def four() -> list[ProcessStacks]:
            found = showing(job.stacks(timeout=5), "deep_sleep")
            return found if len(found) == 4 else []

        found = wait_until(four, timeout=60, what="deep_sleep in the 4 processes")
        assert {p.label for p in found} == {f"replica {r} process {n}" for r in (0, 1) for n in (0, 1)}
        assert len({p.pid for p in found}) == 4 and os.getpid() not in {p.pid for p in found}
    finally:
        stop.touch()
        job.wait(timeout=60)


def test_a_process_job_context_task_shows_with_its_task_id(client, tmp_path):
    stop = tmp_path / "stop"
    job = client.submit(
        JobRequest(name="proctasks", entrypoint=Entrypoint.from_callable(uses_processes, args=(str(stop),)))
    )
    try:

        def task() -> list[ProcessStacks]:
            return [p for p in showing(job.stacks(timeout=5), "inner_wait") if p.task_id]

        found = wait_until(task, timeout=60, what="inner_wait in a process task's stacks")
        assert found[0].pid != os.getpid()
        assert found[0].label == f"task {found[0].task_id}"
    finally:
        stop.touch()
        job.wait(timeout=60)


def test_a_stopped_process_is_reported_not_waited_for(client, tmp_path):
    stop = tmp_path / "stop"
    job = client.submit(
        JobRequest(
            name="stopped",
            entrypoint=Entrypoint.from_callable(deep_sleep, args=(str(stop),)),
            processes_per_task=2,
        )
    )
    try:
        found = wait_until(lambda: showing(job.stacks(timeout=5), "deep_sleep"), timeout=60, what="deep_sleep")
        pid = found[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: _state(pid) == "T", timeout=10, what="the process to stop")
            start = time.monotonic()
            stacks = job.stacks(timeout=1)
            assert time.monotonic() - start < 5
            stopped = [p for p in stacks if p.pid == pid]
            assert stopped and stopped[0].error is not None
            assert f"did not answer within 1 s (pid {pid} on host {socket.gethostname()})" in stopped[0].error
            assert not stopped[0].threads
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        stop.touch()
        job.wait(timeout=60)


def test_asking_a_process_that_ended_says_so_at_once():
    start = time.monotonic()
    answer = _stacks.ask(2**22 + 12345, label="gone", timeout=5)
    assert time.monotonic() - start < 1
    assert answer.error is not None and "ended" in answer.error and not answer.threads


def test_a_fork_child_serves_its_own_stacks():
    _stacks.serve()
    read, write = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: once it serves (a moment after fork), say so; wait until the parent has asked; exit
        os.close(write)
        deadline = time.monotonic() + 30
        while not _stacks.serving() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.write(ready_w, b"x")
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        answer = _stacks.ask(pid, label="child", timeout=5)
        assert answer.error is None, answer.error
        assert answer.pid == pid and answer.threads
        assert Path(_stacks.socket_path(os.getpid())).exists()  # the parent still serves at its own path
    finally:
        os.write(write, b"x")
        os.close(write)
        os.close(ready_r)
        os.waitpid(pid, 0)


def test_a_huge_local_is_shown_in_a_bounded_repr():
    def holder(event: threading.Event) -> None:
        huge = list(range(10_000_000))
        event.wait(30)
        del huge

    event = threading.Event()
    thread = threading.Thread(target=holder, args=(event,))
    thread.start()
    try:

        def frame() -> FrameInfo | None:
            for stack in _stacks.capture(locals=True, threads={thread.ident or 0}):
                for candidate in stack.frames:
                    if candidate.function == "holder" and candidate.locals and dict(candidate.locals).get("huge"):
                        return candidate
            return None

        found = wait_until(frame, timeout=30, what="holder's frame with its list")
        assert found.locals is not None
        text = dict(found.locals)["huge"]
        assert text.startswith("[0, 1, 2") and len(text) <= 200
    finally:
        event.set()
        thread.join()


def test_the_socket_directory_is_private_and_answers_are_json():
    _stacks.serve()
    mode = os.stat(_stacks.socket_dir()).st_mode
    assert stat.S_IMODE(mode) == 0o700
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(5)
        conn.connect(_stacks.socket_path(os.getpid()))
        conn.sendall(b'{"locals": false}\n')
        data = b"".join(iter(lambda: conn.recv(65536), b""))
    reply = json.loads(data)  # plain JSON: no pickle ever crosses
    assert reply["pid"] == os.getpid() and any(t["name"] == "MainThread" for t in reply["threads"])


def test_a_stale_socket_at_a_new_processes_path_is_replaced():
    # A killed process leaves its socket file behind; a later process given the same pid still serves.
    script = (
        "import os, socket, sys, time\n"
        "from fray.core.inside import _stacks\n"
        "stale = socket.socket(socket.AF_UNIX); stale.bind(_stacks.socket_path(os.getpid())); stale.close()\n"
        "_stacks.serve(sweep=False)\n"
        "print('serving' if _stacks.serving() else 'not serving', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "serving"
        answer = _stacks.ask(child.pid, label="child", timeout=10)
        assert answer.error is None and any(thread.name == "MainThread" for thread in answer.threads), answer
    finally:
        child.kill()
        child.wait(timeout=30)


def test_a_foreign_socket_directory_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("FRAY_STACKS_DIR", str(shared))
    with pytest.raises(PermissionError, match="not a private directory"):
        _stacks._private_dir()


def test_sockets_of_ended_processes_are_swept():
    _stacks.serve()
    stale = _stacks.socket_path(2**22 + 4321)  # no such pid: a process that was killed before removing it
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(stale)
    assert os.path.exists(stale)
    _stacks._sweep()
    assert not os.path.exists(stale)
    assert os.path.exists(_stacks.socket_path(os.getpid()))  # a live one stays


def test_starting_processes_sweep_at_most_once_a_minute(tmp_path, monkeypatch):
    # A sweep reads every socket in the directory: thousands of short tasks must not each pay for one.
    monkeypatch.setenv("FRAY_STACKS_DIR", str(tmp_path / "stacks"))
    directory = _stacks._private_dir()
    assert _stacks._sweep_due(directory), "the first process sweeps"
    assert not _stacks._sweep_due(directory), "the next ones, within the minute, do not"
    long_ago = time.time() - _stacks.SWEEP_EVERY_SECONDS - 1
    os.utime(os.path.join(directory, _stacks._STAMP), (long_ago, long_ago))
    assert _stacks._sweep_due(directory), "a minute later one sweeps again"


def _record_pid(path: str) -> None:
    Path(path).write_text(str(os.getpid()))


def test_a_cluster_task_removes_its_socket_when_it_ends(cluster_client, tmp_path):
    # Forked tasks end with os._exit (no atexit hook): the task removes its socket itself.
    directory = _stacks._private_dir()
    _stacks._sweep_due(directory)  # no sweep in the next minute can remove it instead
    where = tmp_path / "pid"
    job = cluster_client.submit(
        JobRequest(name="pid", entrypoint=Entrypoint.from_callable(_record_pid, args=(str(where),)))
    )
    job.wait(timeout=60, raise_on_failure=True)
    pid = int(where.read_text())
    assert not os.path.exists(_stacks.socket_path(pid))
