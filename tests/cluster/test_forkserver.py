"""The fork server: a child gets exactly the environment its worker sent, a task starts in the waiting spare, and a
small callable task reports its own exit before its teardown."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fray import Entrypoint
from fray.cluster.server.envs._environments import Prepared
from fray.cluster.server.taskproc._forkserver import _replace_environment
from fray.cluster.server.taskproc._launch import ForkedProcess, ForkServer, fork_request
from support import alive


def test_a_task_environment_is_exactly_what_the_worker_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fork server inherited the worker's environment, secrets included; the worker strips
    # those from what it sends, so whatever the request lacks must be gone in the child.
    monkeypatch.setenv("FRAY_TOKEN", "worker-secret")
    monkeypatch.setenv("FRAY_TEST_CHANGED", "old")
    monkeypatch.setenv("FRAY_TEST_KEPT", "same")
    wanted = {k: v for k, v in os.environ.items() if k != "FRAY_TOKEN"}
    wanted.update(FRAY_TEST_CHANGED="new", FRAY_TEST_ADDED="added")
    try:
        _replace_environment(wanted)
        assert dict(os.environ) == wanted
        assert "FRAY_TOKEN" not in os.environ and os.getenv("FRAY_TEST_CHANGED") == "new"
    finally:
        os.environ.pop("FRAY_TEST_ADDED", None)  # the one variable monkeypatch does not know to undo


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found.update(int(p) for p in f.read().split())
    return found


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def spared() -> Iterator[tuple[ForkServer, int, int]]:
    """A fork server with its first spare waiting: (the server, the fork server's pid, the spare's pid)."""
    if not os.path.exists("/proc/self/task"):
        pytest.skip("reads the process tree from Linux's /proc")
    server = ForkServer()
    try:
        fork_server = server._proc.pid
        _wait_for(lambda: len(_children(fork_server)) == 1, "the first spare")
        (spare,) = _children(fork_server)
        yield server, fork_server, spare
    finally:
        server.close()


def test_a_task_starts_in_the_waiting_spare_and_a_dead_spare_is_replaced(
    spared: tuple[ForkServer, int, int], tmp_path: Path
) -> None:
    # A task goes to the child forked ahead of it (no fork on its path); a spare that died idle
    # costs the next task only a plain fork, never a lost or hung start.
    server, fork_server, spare = spared
    script = "import os, sys; print(os.getcwd(), os.environ['FRAY_TEST_VALUE'], file=sys.stderr)"
    env = {**os.environ, "FRAY_TEST_VALUE": "from-the-request"}
    request = {"env": env, "cwd": str(tmp_path), "argv": [sys.executable, "-c", script]}
    first = server.launch(request)
    assert first.pid == spare
    assert first.stdout.read().decode().split() == [str(tmp_path), "from-the-request"]  # and end-of-file
    assert first.wait(10) == 0

    _wait_for(lambda: len(_children(fork_server) - {spare}) == 1, "a new spare")
    (second_spare,) = _children(fork_server) - {spare}
    os.kill(second_spare, signal.SIGKILL)
    _wait_for(lambda: second_spare not in _children(fork_server), "the killed spare to be reaped")
    second = server.launch({**request, "argv": [sys.executable, "-c", "import sys; sys.exit(3)"]})
    assert second.pid != second_spare
    assert second.stdout.read() == b""
    assert second.wait(10) == 3


def test_a_large_request_goes_to_a_fresh_fork_and_the_spare_waits_on(
    spared: tuple[ForkServer, int, int], tmp_path: Path
) -> None:
    # Handing a request larger than the spare's socket buffer could block the fork server (which
    # also keeps the lease) on a spare still starting: such a task is forked afresh instead.
    server, fork_server, spare = spared
    # One variable may hold at most 128 KiB for exec: four of 50 KiB make a 200 KiB request.
    big = {f"FRAY_TEST_BIG{i}": "x" * (50 << 10) for i in range(4)}
    script = "import os, sys; print(sum(len(v) for k, v in os.environ.items() if 'BIG' in k), file=sys.stderr)"
    env = {**os.environ, **big}
    task = server.launch({"env": env, "cwd": str(tmp_path), "argv": [sys.executable, "-c", script]})
    assert task.pid != spare
    assert task.stdout.read().decode().split() == [str(4 * (50 << 10))]
    assert task.wait(10) == 0
    assert spare in _children(fork_server)  # still waiting for the next task


def _launch_callable(
    server: ForkServer, tmp_path: Path, entry: Entrypoint, *, holds_device: bool = False
) -> ForkedProcess:
    """Fork a callable task the way the worker asks for one (an inline payload)."""
    import cloudpickle

    ready = Prepared(argv=[], env=dict(os.environ), cwd=str(tmp_path), forkable=True)
    payload = cloudpickle.dumps(entry)
    request = fork_request(
        ready, payload, tmp_path / "payload", tmp_path / "failure", forked_callable=True, holds_device=holds_device
    )
    return server.launch(request)


def test_a_small_callable_task_reports_its_exit_before_its_teardown(
    spared: tuple[ForkServer, int, int], tmp_path: Path
) -> None:
    # The kernel's teardown of a fork of the warm interpreter is the largest step of a trivial
    # job: a small CPU-only task declares its exit code first, and that is what the worker hears.
    server, _, _ = spared
    task = _launch_callable(server, tmp_path, Entrypoint.from_callable(print, args=("from the task",)))
    assert task.stdout.read() == b"from the task\n"
    assert task.wait(10) == 0 and task.declared
    failed = _launch_callable(server, tmp_path, Entrypoint.from_callable(sys.exit, args=(3,)))
    assert b"SystemExit: 3" in failed.stdout.read()
    assert failed.wait(10) == 1 and failed.declared  # what waitpid would have said: _jobmain's code for a failure
    assert (tmp_path / "failure").exists()  # written before the exit was declared


def test_a_task_holding_a_device_or_much_memory_is_reported_once_it_is_gone(
    spared: tuple[ForkServer, int, int], tmp_path: Path
) -> None:
    # Its device and its memory are free only once the kernel tore the process down: the next task
    # placed on them must find them free, so its exit is reported by waitpid, never declared.
    server, _, _ = spared
    device = _launch_callable(server, tmp_path, Entrypoint.from_callable(print, args=("gpu",)), holds_device=True)
    assert device.stdout.read() == b"gpu\n"
    assert device.wait(10) == 0 and not device.declared and not alive(device.pid)
    # 300 MiB resident at its exit: more than a task may hold and still declare (_DECLARE_MAX_RSS).
    ballast = "import sys; sys.fray_test_ballast = b'x' * (300 << 20)"
    large = _launch_callable(server, tmp_path, Entrypoint.from_callable(exec, args=(ballast,)))
    assert large.stdout.read() == b""
    assert large.wait(10) == 0 and not large.declared and not alive(large.pid)
    killed = _launch_callable(server, tmp_path, Entrypoint.from_callable(exec, args=("import time; time.sleep(60)",)))
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.stdout.read() == b""
    assert killed.wait(10) == -signal.SIGKILL and not killed.declared
