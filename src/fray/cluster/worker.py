"""The worker daemon: registers with the controller, runs tasks as processes, reports back.

Three loops: the *command* loop long-polls the controller and starts or kills
tasks; the *report* loop sends task starts, exits and log lines as soon as there
are any (and a heartbeat when there are none); one thread per task reads its
output and waits for it to exit. When the controller goes away, tasks keep
running and the worker reconnects, re-registers with the tasks it still runs, and
obeys the controller's verdict on each (kill the ones it no longer wants).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from fray._lifecycle import Failure
from fray._process import kill_process_group
from fray.cluster._environments import prepare as prepare_environment
from fray.cluster.capacity import Device, WorkerInfo
from fray.cluster.controller_client import controller_client
from fray.cluster.messages import TaskAssignment, TaskExit, WorkerCommands, WorkerReport
from fray.cluster.records import TaskKey
from fray.errors import FrayError
from fray.job import JobInfo, replica_env
from fray.rpc.namespace import default_token

__all__ = ["Worker"]

#: How many of a failed task's last output lines its failure message quotes.
LAST_OUTPUT_LINES = 5

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True) if sys.platform == "linux" else None


def _die_with_worker() -> None:
    # Runs in the child between fork and exec: if the worker is killed (even with
    # SIGKILL), its tasks die too instead of running on as orphans the controller
    # has already rescheduled elsewhere.
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


class _ForkedProcess:
    """A task forked by the fork server: the parts of ``Popen`` the worker uses."""

    def __init__(self, pid: int, output: int) -> None:
        self.pid = pid
        self.stdout = os.fdopen(output, "rb")
        self._exited = threading.Event()
        self.returncode: int | None = None

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"task {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class _ForkServer:
    """The worker's end of :mod:`fray.cluster._forkserver`: asks it to fork tasks, hears of their exits."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "fray.cluster._forkserver", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_worker,
        )
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self._ids = iter(range(1, 1 << 62))
        # Launches waiting for their fork: id -> (fork done, output read end, the process once forked).
        self._waiting: dict[str, tuple[threading.Event, int, list[_ForkedProcess]]] = {}
        self._children: dict[str, _ForkedProcess] = {}
        self.alive = True
        threading.Thread(target=self._read, name="fray-forkserver", daemon=True).start()

    def launch(self, payload: str, failure: str, env: dict[str, str], cwd: str) -> _ForkedProcess:
        """Fork a task process; raises OSError if the fork server is gone."""
        read_end, write_end = os.pipe()
        forked: list[_ForkedProcess] = []
        done = threading.Event()
        with self._lock:
            task = str(next(self._ids))
            self._waiting[task] = (done, read_end, forked)
        line = json.dumps({"id": task, "payload": payload, "failure": failure, "env": env, "cwd": cwd}) + "\n"
        try:
            with self._lock:
                socket.send_fds(self._sock, [line.encode()], [write_end])
        except OSError:
            self.alive = False
            with self._lock:
                self._waiting.pop(task, None)
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        if not done.wait(10.0) or not forked:
            self.alive = False
            with self._lock:
                if self._waiting.pop(task, None) is not None:
                    os.close(read_end)
            raise OSError("the fork server did not fork the task")
        return forked[0]

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in self._sock.makefile("rb"):
                message = json.loads(raw)
                if "started" in message:
                    with self._lock:
                        done, output, forked = self._waiting.pop(message["started"])
                        child = _ForkedProcess(int(message["pid"]), output)
                        self._children[message["started"]] = child
                    forked.append(child)
                    done.set()
                else:
                    with self._lock:
                        exited = self._children.pop(message["exited"], None)
                    if exited is not None:
                        exited._set_exit(int(message["code"]))
        self.alive = False
        with self._lock:
            waiting, self._waiting = self._waiting, {}
            children, self._children = self._children, {}
        for done, _, _ in waiting.values():
            done.set()
        for child in children.values():  # the fork server died, and its children with it
            child._set_exit(-int(signal.SIGKILL))

    def close(self) -> None:
        """Stop the fork server (its children die with it)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)


@dataclass
class _Task:
    assignment: TaskAssignment
    proc: subprocess.Popen[bytes] | _ForkedProcess | None
    failure_path: Path
    killed: bool = False


@dataclass
class _Pending:
    """Reports not yet delivered to the controller."""

    started: list[TaskKey] = field(default_factory=list)
    exited: list[TaskExit] = field(default_factory=list)
    logs: dict[TaskKey, list[str]] = field(default_factory=dict)

    def take(self) -> WorkerReport:
        report = WorkerReport(list(self.started), list(self.exited), list(self.logs.items()))
        self.started.clear()
        self.exited.clear()
        self.logs.clear()
        return report

    def put_back(self, report: WorkerReport) -> None:
        self.started[:0] = report.started
        self.exited[:0] = report.exited
        for key, lines in report.logs:
            self.logs.setdefault(key, [])[:0] = lines


class Worker:
    """Runs the controller's tasks on this machine.

    Resources default to the machine's (cpu count, physical memory, free disk in
    ``workdir``); ``devices`` and ``attributes`` (``preemptible``, ``region``,
    ``zone``, ``tpu-name``, ``tpu-worker-id``, ...) describe what the scheduler may
    rely on.
    """

    def __init__(
        self,
        controller: str,
        *,
        token: str | bytes | None = None,
        worker_id: str | None = None,
        cpu: float | None = None,
        ram_bytes: int | None = None,
        disk_bytes: int | None = None,
        devices: tuple[Device, ...] = (),
        attributes: dict[str, str] | None = None,
        workdir: str | None = None,
        poll_wait: float = 2.0,
        heartbeat: float = 1.0,
    ) -> None:
        self.controller = controller
        self._token = default_token(token)
        self.worker_id = worker_id or f"worker-{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self.workdir = Path(workdir or Path.home() / ".cache" / "fray" / "workers" / self.worker_id)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.info = WorkerInfo(
            worker_id=self.worker_id,
            cpu_millis=int((cpu if cpu is not None else os.cpu_count() or 1) * 1000),
            ram_bytes=ram_bytes if ram_bytes is not None else _total_memory(),
            disk_bytes=disk_bytes if disk_bytes is not None else shutil.disk_usage(self.workdir).free,
            devices=tuple(devices),
            attributes=dict(attributes or {}),
        )
        self._poll_wait = poll_wait
        self._heartbeat = heartbeat
        self._client = controller_client(controller, token)
        self._lock = threading.Lock()
        self._tasks: dict[TaskKey, _Task] = {}
        self._pending = _Pending()
        self._report_ready = threading.Event()
        self._stopping = threading.Event()
        self._registered = False
        self._threads: list[threading.Thread] = []
        self._forkserver: _ForkServer | None = None
        self._refused: set[TaskKey] = set()

    # ----- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Worker:
        """Run the worker in background threads."""
        for target, name in ((self._command_loop, "commands"), (self._report_loop, "reports")):
            thread = threading.Thread(target=target, name=f"fray-worker-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def run(self) -> None:
        """Run until :meth:`stop` is called or the process gets SIGTERM/SIGINT."""
        self.start()
        self._stopping.wait()

    def stop(self, *, kill_tasks: bool = True) -> None:
        """Stop polling; kill running tasks unless told otherwise."""
        self._stopping.set()
        self._report_ready.set()
        if kill_tasks:
            with self._lock:
                tasks = list(self._tasks.values())
            for task in tasks:
                if task.proc is not None:
                    kill_process_group(task.proc, grace=1.0)
        for thread in self._threads:
            thread.join(timeout=5)
        if self._forkserver is not None:
            self._forkserver.close()
        self._client.close()

    @property
    def running(self) -> list[TaskKey]:
        """Tasks whose processes are running here."""
        with self._lock:
            return [key for key, task in self._tasks.items() if task.proc is not None and task.proc.poll() is None]

    # ----- commands -----------------------------------------------------------------------------

    def _command_loop(self) -> None:
        # Task processes are started from this one long-lived thread: the kernel's
        # parent-death signal follows the thread that forked them.
        backoff = 0.05
        poller = self._client.with_options(timeout=self._poll_wait + 30.0)
        try:
            self._forkserver = _ForkServer()  # warm it up before the first task needs it
        except OSError as exc:
            logger.warning("cannot start the fork server (%s); tasks start as new processes", exc)
        while not self._stopping.is_set():
            try:
                if not self._registered:
                    commands = self._client.register_worker(self.info, self._address(), self.running)
                    self._registered = True
                    logger.info("worker %s registered with %s", self.worker_id, self.controller)
                else:
                    commands = poller.poll(self.worker_id, self._poll_wait)
                backoff = 0.05
            except (FrayError, OSError) as exc:
                self._registered = False
                logger.warning("controller %s unreachable (%s); retrying in %.2fs", self.controller, exc, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            self._obey(commands)

    def _address(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}"

    def _obey(self, commands: WorkerCommands) -> None:
        if commands.reregister:
            self._registered = False
            return
        # Starts first: a kill in the same batch may be for a task started just now.
        for assignment in commands.start:
            with self._lock:
                skip = assignment.key in self._tasks or assignment.key in self._refused
            if not skip:
                self._launch(assignment)
        for key in commands.kill:
            self._kill(key)

    def _kill(self, key: TaskKey) -> None:
        with self._lock:
            task = self._tasks.get(key)
            if task is not None:
                task.killed = True
        if task is None:
            # Not running here (any more): never start it later (a resent assignment), and
            # confirm, so the controller stops waiting for it.
            with self._lock:
                self._refused.add(key)
            self._queue_exit(TaskExit(key, -int(signal.SIGKILL)))
        elif task.proc is not None:
            kill_process_group(task.proc)

    def _launch(self, assignment: TaskAssignment) -> None:
        key, spec = assignment.key, assignment.spec
        task_dir = self.workdir / "tasks" / f"{key.job_id.replace('/', '__')}-{key.task_index}-{key.attempt}"
        task_dir.mkdir(parents=True, exist_ok=True)
        failure_path = task_dir / "failure.pkl"
        info = JobInfo(
            key.job_id,
            assignment.job_name,
            assignment.replica_index,
            assignment.replica_count,
            assignment.namespace,
            key.attempt,
        )
        # The worker's own variables, then Fray's for this task, then the user's (which win).
        env = dict(os.environ)
        env.update(
            FRAY_TASK_INDEX=str(key.task_index),
            FRAY_HOST_INDEX=str(assignment.host_index),
            FRAY_WORKER_ID=self.worker_id,
        )
        if self._token is not None:
            env["FRAY_TOKEN"] = self._token.decode()
        env.update(replica_env(info, f"fray://{self.controller}", spec.environment.env_vars))
        if spec.argv is not None:
            argv = list(spec.argv)
        else:
            assert spec.payload is not None
            payload = task_dir / "payload.pkl"
            payload.write_bytes(spec.payload)
            argv = [sys.executable, "-m", "fray.cluster._task", str(payload), str(failure_path)]
        task = _Task(assignment, None, failure_path)
        with self._lock:
            self._tasks[key] = task
        cwd = spec.environment.workspace or str(task_dir)
        try:  # pip_packages, workspace, docker_image: see fray.cluster._environments
            ready = prepare_environment(
                spec, argv, env, cwd, workdir=self.workdir, controller=self.controller, token=self._token,
                log=lambda line: self._queue_logs(key, [line]),
            )  # fmt: skip
            argv, env, cwd = ready.argv, ready.env, ready.cwd
        except (FrayError, OSError) as exc:
            with self._lock:
                del self._tasks[key]
            message = f"cannot prepare the job's environment: {exc}"
            self._queue_logs(key, [f"[fray] {line}" for line in message.splitlines()])
            self._queue_exit(TaskExit(key, 127, Failure(message, exit_code=127).encode()))
            return
        if (
            ready.forkable
            and spec.argv is None
            and not any(k.startswith("PYTHON") and k != "PYTHONUNBUFFERED" for k in spec.environment.env_vars)
        ):
            forked = self._fork(argv[-2], argv[-1], env, cwd)
            if forked is not None:
                self._started(task, forked)
                return
        try:
            proc: subprocess.Popen[bytes] | _ForkedProcess = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_die_with_worker,
            )
        except OSError as exc:
            with self._lock:
                del self._tasks[key]
            message = f"cannot start {argv[0]!r}: {exc}"
            self._queue_logs(key, [f"[fray] {message}"])
            self._queue_exit(TaskExit(key, 127, Failure(message, exit_code=127).encode()))
            return
        self._started(task, proc)

    def _fork(self, payload: str, failure: str, env: dict[str, str], cwd: str) -> _ForkedProcess | None:
        """Fork the task from the warm fork server; None (start it the slow way) if that fails."""
        try:
            if self._forkserver is None or not self._forkserver.alive:
                if self._forkserver is not None:
                    self._forkserver.close()
                self._forkserver = _ForkServer()
            return self._forkserver.launch(payload, failure, env, cwd)
        except OSError as exc:
            logger.warning("fork server failed (%s); starting the task as a new process", exc)
            # Stop it now: a fork it finishes late must not run beside the replacement.
            if self._forkserver is not None:
                self._forkserver.close()
                self._forkserver = None
            return None

    def _started(self, task: _Task, proc: subprocess.Popen[bytes] | _ForkedProcess) -> None:
        task.proc = proc
        with self._lock:
            self._pending.started.append(task.assignment.key)
        self._report_ready.set()
        name = f"fray-task-{task.assignment.key}"
        threading.Thread(target=self._watch, args=(task,), name=name, daemon=True).start()

    def _watch(self, task: _Task) -> None:
        proc, key = task.proc, task.assignment.key
        assert proc is not None and proc.stdout is not None
        last: collections.deque[str] = collections.deque(maxlen=LAST_OUTPUT_LINES)
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            last.append(line)
            self._queue_logs(key, [line])
        code = proc.wait()
        failure = None if code == 0 or task.killed else self._failure(task, code, list(last))
        with self._lock:
            self._tasks.pop(key, None)
        self._queue_exit(TaskExit(key, code, failure))

    @staticmethod
    def _failure(task: _Task, code: int, last_output: list[str]) -> bytes:
        """Why the task failed, encoded: what its Python code raised, else its exit and last output."""
        with contextlib.suppress(OSError):
            return task.failure_path.read_bytes()  # written by fray.cluster._task
        spec = task.assignment.spec
        command = spec.argv[0] if spec.argv else task.assignment.job_name
        return Failure.from_exit(command, code, last_output).encode()

    # ----- reports ------------------------------------------------------------------------------

    def _queue_logs(self, key: TaskKey, lines: list[str]) -> None:
        with self._lock:
            self._pending.logs.setdefault(key, []).extend(lines)
        self._report_ready.set()

    def _queue_exit(self, exit_: TaskExit) -> None:
        with self._lock:
            self._pending.exited.append(exit_)
        self._report_ready.set()

    def _report_loop(self) -> None:
        backoff = 0.05
        while not self._stopping.is_set():
            self._report_ready.wait(self._heartbeat)
            self._report_ready.clear()
            with self._lock:
                report = self._pending.take()
            try:
                if not self._client.report(self.worker_id, report):
                    self._registered = False
                backoff = 0.05
            except (FrayError, OSError) as exc:
                with self._lock:
                    self._pending.put_back(report)
                logger.debug("report failed (%s); retrying", exc)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 2.0)
                self._report_ready.set()
