"""The worker daemon: registers with the controller, runs tasks as processes, reports back.

Four loops, none of which may die (each catches, logs and carries on after anything):

* the *command* loop registers, long-polls the controller and starts or kills tasks;
* the *report* loop sends task starts, exits and log lines as soon as there are any
  (and a heartbeat when there are none);
* the *lease* loop renews the worker's lease with its fork server several times a
  second, so that tasks of a frozen worker are killed before the controller replaces
  them (see :mod:`fray.cluster.server.taskproc._forkserver`). It renews only up to the lease's length
  after the worker last heard from the controller: a worker cut off from it (a network
  partition, a controller down) stops its own tasks 0.75 x the worker timeout after its
  last contact, before the controller, which waits the whole timeout, can have given
  them to another worker. No task ever has two live attempts.
  An answer to a request sent more than a lease ago (the controller stood still meanwhile)
  is confirmed by a fresh round trip before its tasks start, so they do not start under
  the lapsed lease only to be killed at once;
* the *keep-alive* (:mod:`._keepalive`) sends a small heartbeat whenever nothing has answered
  for lease/16, each attempt in its own thread with a short timeout, so a network blip shorter
  than 60 % of the worker timeout never lapses the lease, and the lease loop renews the moment
  contact is back.

One thread per task reads its output (bounded by :mod:`._task_output`) and waits for it to exit; a
task's environment is built by :mod:`._task_env`, what the worker keeps of its tasks is in :mod:`._worker_tasks`.

Leaving (:meth:`Worker.drain`, what ``fray worker`` does on SIGTERM or SIGINT): the worker
takes no new task (its health note says it is draining, so the controller places nothing more
here), sends SIGTERM to every task and gives them up to ``drain_seconds`` to end (then SIGKILL).
Every task it stopped is *handed back*, whatever its exit status: it was interrupted, and a clean
exit on SIGTERM (an actor's, a trainer's that saved a checkpoint) is not its job's end. The worker
tells the controller it leaves (``leave``), and the controller, in one transaction, records the
exits of tasks that had ended before the drain,
loses what the worker still held -- its gangs get new attempts elsewhere under
``max_retries_preemption``, as for a preempted VM -- and lists the worker as STOPPED, not lost.
The tasks have ended before the controller hears of it, so none runs twice. A worker that cannot
reach the controller meanwhile exits all the same: it is then declared lost after the worker
timeout, with the same outcome for its tasks, and the exits it could not report stay in its journal.

Retrying is for what may heal: a controller not up yet, or restarting. A first answer that
cannot change by retrying -- the controller refuses the worker's credential, or the server is
not the cluster's (its TLS certificate is not the cluster CA's; it cannot prove it holds the
key) -- ends the worker instead, with one line saying why (see :attr:`Worker.refusal`). Once
registered, the worker gives up only when the controller refuses its credential (it was
revoked): it stops its tasks, which the controller has given new attempts elsewhere. Anything
else it retries: its tasks keep running through it.

Joining (``join=``, ``fray worker --join TOKEN``): a worker with a join token first checks the
controller against the CA the token pins (before anything secret is sent), exchanges the token
for its own credential and keeps it 0600 in ``workdir/credential`` with the token's id; started
again with the same token (or none), it reuses that credential, so a token may expire once its
workers have joined. The token, the kept credential and the lines a worker gives up with are in
:mod:`fray.cluster.server.worker._worker_join`.

Exactly-once completion: a task's exit goes into the durable :class:`OutcomeJournal`
first (in memory at once, to disk while its report is on its way), and leaves it only
when the controller has recorded it -- through a report, or
through a registration, which always carries every unacknowledged outcome along with
the tasks still running. Registrations and reports never overlap (one session lock), and
each names the worker's *epoch*: the controller refuses the reports of an epoch it has
ended (a worker it declared lost), so a stale outcome is never accepted.

The package is the worker's layer: besides :class:`Worker` it holds a task's environment
and output caps, the outcome journal, the task records and joining with a token. What
runs inside a task process is in :mod:`fray.cluster.server.taskproc`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from fray.cluster.protocol.capacity import Device, WorkerInfo
from fray.cluster.protocol.controller_client import CredentialLike, controller_client, resolve_credential
from fray.cluster.protocol.credentials import Credential, issued_id
from fray.cluster.protocol.messages import TaskAssignment, TaskExit, WorkerCommands, WorkerReport
from fray.cluster.protocol.records import TaskKey
from fray.cluster.server.envs._environments import prepare as prepare_environment
from fray.cluster.server.launcher import DEFAULT_DRAIN_SECONDS
from fray.cluster.server.taskproc._launch import ForkedProcess, ForkServer, die_with_worker, fork_request
from fray.cluster.server.worker._journal import OutcomeJournal
from fray.cluster.server.worker._keepalive import KeepAlive
from fray.cluster.server.worker._memory import MemoryWatch
from fray.cluster.server.worker._task_env import nul_problem, task_env
from fray.cluster.server.worker._task_output import LAST_OUTPUT_LINES, OutputCap
from fray.cluster.server.worker._worker_join import join_token, refusal_line, revoked, stored_credential
from fray.cluster.server.worker._worker_stacks import answer_stacks_soon
from fray.cluster.server.worker._worker_tasks import PendingReports, Process, TaskProcess
from fray.core._lifecycle import Failure
from fray.core._private_files import private_dir, write_private
from fray.errors import FrayError
from fray.process._process import kill_process_group
from fray.stacks import ProcessStacks

__all__ = ["DEFAULT_DRAIN_SECONDS", "LAST_OUTPUT_LINES", "Worker"]

logger = logging.getLogger(__name__)

# A report of log lines alone waits this long after the first, so a task's burst of lines costs one report.
_REPORT_GATHER_SECONDS = 0.003
# How long a draining worker keeps trying to tell the controller it leaves, once its tasks have ended.
_LEAVE_SECONDS = 5.0

# A start waits this long for the task's exit: a short task's start and exit then cost one report (one
# controller transaction, one round trip), and its exit is not queued behind its own start's report. A
# long task shows RUNNING this much later.
_START_GATHER_SECONDS = 0.02


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


class Worker:
    """Runs the controller's tasks on this machine.

    ``token`` is the worker's credential (default: ``FRAY_CREDENTIAL``, which the
    launcher sets to the worker credential; the cluster token works too).

    Resources default to the machine's (cpu count, physical memory, free disk in
    ``workdir``); ``devices`` and ``attributes`` (``preemptible``, ``region``,
    ``zone``, ``tpu-name``, ``tpu-worker-id``, ...) describe what the scheduler may
    rely on.

    ``join`` is a join token (its one-line form): the worker joins with it unless its
    ``workdir`` holds a credential from that same token (or ``join`` is None and it holds
    one), and then speaks with its own credential (see the module's docstring).

    If the controller's first answer is a refusal that retrying cannot change (see the
    module's docstring), or it later refuses the worker's credential (revoked), the worker
    stops, sets :attr:`refusal` to a one-line reason and calls ``on_refused`` with it
    (default: logs it).

    ``drain_seconds`` is how long :meth:`drain` gives running tasks between SIGTERM and SIGKILL.
    """

    def __init__(
        self,
        controller: str,
        *,
        token: CredentialLike = None,
        worker_id: str | None = None,
        cpu: float | None = None,
        ram_bytes: int | None = None,
        disk_bytes: int | None = None,
        devices: tuple[Device, ...] = (),
        attributes: dict[str, str] | None = None,
        workdir: str | None = None,
        poll_wait: float = 2.0,
        heartbeat: float = 1.0,
        on_refused: Callable[[str], None] | None = None,
        join: str | None = None,
        drain_seconds: float = DEFAULT_DRAIN_SECONDS,
    ) -> None:
        self.controller = controller
        #: How long :meth:`drain` gives running tasks to end after SIGTERM.
        self.drain_seconds = drain_seconds
        token_of_join = join_token(join) if join else None
        # A joining worker's default id is its host's name (one worker a host), so that it is the same
        # when it starts again and finds its credential.
        default_id = (
            socket.gethostname().split(".")[0] if join else f"worker-{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        )
        self.worker_id = worker_id or default_id
        self.workdir = private_dir(workdir or Path.home() / ".cache" / "fray" / "workers" / self.worker_id)
        private_dir(self.workdir / "tasks")  # also when an older Fray made it with the umask's mode
        #: Where a worker that joined keeps its own credential (0600) and the id of the token it came from.
        self.credential_file = self.workdir / "credential"
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
        self._join_token = token_of_join
        stored = stored_credential(self.credential_file, self.worker_id, token_of_join)
        if stored is not None or token_of_join is not None:
            self._credential: Credential | None = stored  # None: join first (see _register)
        else:
            self._credential = resolve_credential(token)  # also what fetches job workspaces
        self._client = controller_client(controller, self._credential)
        self._lock = threading.Lock()
        self._session = threading.Lock()  # registrations and reports never overlap
        self._tasks: dict[TaskKey, TaskProcess] = {}
        self._pending = PendingReports()
        self._journal = OutcomeJournal(self.workdir / "outcomes")
        self._report_ready = threading.Event()  # something waits to be reported
        self._report_urgent = threading.Event()  # a start or an exit does: report it at once
        self._stopping = threading.Event()
        self._registered = False
        self._epoch = 0
        self._lease_seconds = 0.0
        # When the controller last answered (monotonic; taken when the request was sent, so never later
        # than the controller heard from us): the lease runs from here, not from the local clock.
        self._contact = time.monotonic()
        self._contact_moved = threading.Event()  # wakes the lease loop: renew at once after a contact
        self._threads: list[threading.Thread] = []
        self._forkserver: ForkServer | None = None
        self._refused: set[TaskKey] = set()
        self._health = ""  # why this worker cannot start tasks now ("" when it can)
        self._joined = False  # registered at least once: from then on, every failure is retried
        self._on_refused = on_refused
        #: Why the controller's first answer ended this worker (None: it was not refused).
        self.refusal: str | None = None
        self._draining = ""  # why this worker is leaving ("" while it is not): it starts no new task
        self._hand_back_now = threading.Event()  # a second signal: SIGKILL the tasks without waiting
        self._left = False  # the controller heard this worker leave: never register again
        #: Whether the controller heard this worker leave (:meth:`drain`): it lists it as STOPPED.
        self.left = False

    # ----- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Worker:
        """Run the worker in background threads."""
        loops = ((self._command_loop, "commands"), (self._report_loop, "reports"), (self._lease_loop, "lease"))
        for target, name in loops:
            thread = threading.Thread(target=target, name=f"fray-worker-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        # Short, frequent heartbeats while the link is quiet, so that a blip does not lapse the lease.
        keepalive = KeepAlive(
            beat=self._beat, lease=lambda: self._lease_seconds if self._registered else 0.0,
            last_contact=lambda: self._contact, stopping=self._stopping,
        )  # fmt: skip
        self._threads.append(keepalive.start())
        # A job's ram is its tasks' memory limit (see ._memory): one thread samples them all.
        self._threads.append(MemoryWatch(self._running_tasks, self._stopping).start())
        return self

    def _running_tasks(self) -> list[TaskProcess]:
        with self._lock:
            return list(self._tasks.values())

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
        # Closing the client first ends a long poll in flight at once (the command loop then sees it is stopping).
        self._client.close()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._forkserver is not None:
            self._forkserver.close()

    def drain(self, reason: str = "SIGTERM") -> bool:
        """Leave the cluster (see the module's docstring): hand the tasks back, tell the controller, :meth:`stop`.

        Takes at most :attr:`drain_seconds` for the tasks to end (:meth:`hand_back_now` cuts it short)
        and a few seconds more to tell the controller. Returns whether the controller heard it.
        """
        deadline = time.monotonic() + self.drain_seconds
        with self._lock:
            self._draining = reason
            tasks = list(self._tasks.values())
            for task in tasks:
                task.handed_back = True
        logger.warning(
            "worker %s is leaving (%s): %d tasks get up to %gs to end, then go back to the controller",
            self.worker_id, reason, len(tasks), self.drain_seconds,
        )  # fmt: skip
        self._report_ready.set()  # the health note: the controller places nothing more here
        self._report_urgent.set()
        signalled: set[TaskKey] = set()
        killed = False
        reap_by = deadline + 5.0  # SIGKILLed tasks are reaped at once; one that is not is left behind
        while True:
            with self._lock:
                for task in self._tasks.values():  # also one whose start was under way when the drain began
                    task.handed_back = True
                left = [t for t in self._tasks.values() if t.proc is not None]
            now = time.monotonic()
            if not left or now >= reap_by:
                break
            for task in left:
                if task.assignment.key not in signalled:
                    signalled.add(task.assignment.key)
                    _signal_group(task.proc, signal.SIGKILL if killed else signal.SIGTERM)
            if not killed and (now >= deadline or self._hand_back_now.is_set()):
                killed = True
                for task in left:
                    _signal_group(task.proc, signal.SIGKILL)
            if killed:
                time.sleep(0.02)  # waiting for the kernel to reap them: there is nothing to block on
            else:
                self._hand_back_now.wait(0.02)
        told = self._leave(reason)
        self.stop()
        return told

    def hand_back_now(self) -> None:
        """Cut a :meth:`drain` short: SIGKILL the tasks still running and leave."""
        self._hand_back_now.set()

    def _leave(self, reason: str) -> bool:
        """Tell the controller this worker leaves, with its last exits; retried for a few seconds."""
        if not self._joined:
            return False  # never registered: nothing to tell
        with contextlib.suppress(Exception):  # best effort: the last starts and log lines, before the epoch ends
            self._report()
        give_up = time.monotonic() + _LEAVE_SECONDS
        backoff = 0.05
        why = f"it left the cluster ({reason}: drained, its tasks handed back)"
        while True:
            try:
                with self._session:
                    with self._lock:
                        exits = self._journal.pending()
                    self._client.with_timeout(_LEAVE_SECONDS).leave(self.worker_id, why, exits)
                    self._journal.acknowledge([e.key for e in exits])
                    self._left = self.left = True
                    self._registered = False
                    self._stopping.set()
                logger.info("worker %s left %s: it is listed as stopped", self.worker_id, self.controller)
                return True
            except Exception as exc:
                if time.monotonic() + backoff > give_up or revoked(self.worker_id, self.controller, exc):
                    logger.warning(
                        "worker %s could not tell %s it leaves (%s): it will be declared lost after the worker "
                        "timeout, with the same outcome for its tasks",
                        self.worker_id, self.controller, _describe(exc),
                    )  # fmt: skip
                    return False
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

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
        self._forkserver = self._start_forkserver()
        while not self._stopping.is_set():
            try:
                sent = time.monotonic()
                if not self._registered:
                    commands = self._register()
                else:
                    poller = self._client.with_timeout(self._poll_wait + 30.0)
                    commands = poller.poll(self.worker_id, self._epoch, self._poll_wait)
                self._heard(sent)
                backoff = 0.05
                if commands.start and self._lease_seconds and self._lease_left() <= 0:
                    commands = self._confirmed(commands)
                self._obey(commands)
            except Exception as exc:  # never dies: an unreachable controller, or a bug of ours
                if self._stopping.is_set():
                    return  # stopped while a call was in flight (stop() closes the client under it)
                if self._joined:
                    refusal = revoked(self.worker_id, self.controller, exc)
                else:
                    refusal = refusal_line(self.worker_id, self.controller, exc, joining=self._join_token is not None)
                if refusal is not None:
                    self._give_up(refusal)
                    return
                # A poll whose answer was lost (the controller died or restarted mid-call) may have
                # carried assignments; only a registration gets them again, so register next.
                self._registered = False
                logger.warning("controller %s: %s; retrying in %.2fs", self.controller, _describe(exc), backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _confirmed(self, commands: WorkerCommands) -> WorkerCommands:
        # An answer to a request sent more than a lease ago (the controller stood still, or the
        # network, meanwhile) proves nothing recent: tasks started on it would run under the
        # lapsed lease, be killed at once and come back as new attempts, burning their retries
        # in a loop. A fresh round trip renews the lease first; its answer's commands join.
        sent = time.monotonic()
        try:
            more = self._client.poll(self.worker_id, self._epoch, 0.0)
        except Exception as exc:  # unreachable again: obey as before; the lease stops the tasks
            logger.warning("controller %s: %s; starting tasks under a lapsed lease", self.controller, _describe(exc))
            return commands
        self._heard(sent)
        if more.reregister:  # the registration gets every assignment not yet started again
            return more
        return replace(
            more,
            start=commands.start + more.start,
            kill=commands.kill + more.kill,
            stacks=commands.stacks + more.stacks,
        )

    def _join(self) -> None:
        """Exchange the join token for this worker's own credential, kept 0600 in :attr:`credential_file`."""
        assert self._join_token is not None
        joiner = controller_client(self.controller, self._join_token, timeout=30.0)
        try:
            credential = joiner.join(self.worker_id)
        finally:
            joiner.close()
        write_private(
            self.credential_file, f"{credential.encode()}\njoin-token {issued_id(self._join_token.principal)}\n"
        )
        self._credential = credential
        old, self._client = self._client, controller_client(self.controller, credential)
        old.close()
        logger.info("worker %s joined %s with its own credential", self.worker_id, self.controller)

    def _register(self) -> WorkerCommands:
        """(Re)join with every task still running here and every outcome not acknowledged yet."""
        if self._credential is None:
            self._join()
        with self._session:
            if self._left:  # it left: the controller lists it as stopped, and so it stays
                return WorkerCommands()
            with self._lock:
                running = list(self._tasks)
                exits = self._journal.pending()
            commands = self._client.register_worker(self.info, self._address(), running, exits)
            self._journal.acknowledge([e.key for e in exits])
            self._epoch = commands.epoch
            self._lease_seconds = commands.lease_seconds
            self._registered = True
            self._joined = True
        logger.info("worker %s registered with %s (epoch %d)", self.worker_id, self.controller, commands.epoch)
        return commands

    def _address(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}"

    def _give_up(self, refusal: str) -> None:
        self.refusal = refusal
        self._stopping.set()
        self._report_ready.set()
        with self._lock:
            procs = [t.proc for t in self._tasks.values() if t.proc is not None]
        for proc in procs:  # revoked: the controller has given them new attempts elsewhere
            kill_process_group(proc, grace=1.0)
        if self._on_refused is not None:
            self._on_refused(refusal)
        else:
            logger.error("%s", refusal)

    def _obey(self, commands: WorkerCommands) -> None:
        if commands.reregister:
            self._registered = False
            return
        # Starts first: a kill in the same batch may be for a task started just now.
        for assignment in commands.start:
            with self._lock:
                skip = assignment.key in self._tasks or assignment.key in self._refused
                skip = skip or assignment.key in self._journal
                # Leaving: not started; the controller loses it with this worker and retries it elsewhere.
                skip = skip or bool(self._draining)
            if not skip:
                try:
                    self._launch(assignment)
                except Exception as exc:  # a task we cannot start fails; the worker goes on
                    logger.exception("cannot start task %s", assignment.key)
                    self._cannot_start(assignment.key, f"the worker could not start the task: {_describe(exc)}")
                    if isinstance(exc, OSError):  # the machine, not the task: take no more until it recovers
                        self._health = f"cannot start tasks in {self.workdir}: {_describe(exc)}"
                        self._report_ready.set()
        for key in commands.kill:
            self._kill(key)
        for ask in commands.stacks:  # live stacks: answered from a thread, the loop polls on
            answer_stacks_soon(ask, self._task_pid, self._answer_stacks)

    def _task_pid(self, key: TaskKey) -> int | None:
        with self._lock:
            task = self._tasks.get(key)
        proc = task.proc if task is not None else None
        return proc.pid if proc is not None and proc.poll() is None else None

    def _answer_stacks(self, request_id: int, stacks: list[ProcessStacks]) -> None:
        self._client.with_timeout(30.0).stacks_answer(self.worker_id, self._epoch, request_id, stacks)

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
                known = key in self._journal
            if not known:
                self._record_exit(TaskExit(key, -9))
        elif task.proc is not None:
            kill_process_group(task.proc)

    def _cannot_start(self, key: TaskKey, message: str) -> None:
        with self._lock:
            self._tasks.pop(key, None)
        self._queue_logs(key, [f"[fray] {message}"])
        self._record_exit(TaskExit(key, 127, Failure(message, exit_code=127).encode()))

    def _launch(self, assignment: TaskAssignment) -> None:
        key, spec = assignment.key, assignment.spec
        task_dir = self.workdir / "tasks" / f"{key.job_id.replace('/', '__')}-{key.task_index}-{key.attempt}"
        failure_path = task_dir / "failure.pkl"
        env = task_env(assignment, self.worker_id, self.controller)
        argv = list(spec.argv) if spec.argv is not None else None
        problem = nul_problem(argv or [], env)
        if problem:
            self._cannot_start(key, f"cannot start the task: {problem}")
            return
        payload = task_dir / "payload.pkl"
        fresh_interpreter = any(k.startswith("PYTHON") and k != "PYTHONUNBUFFERED" for k in spec.environment.env_vars)
        if spec.argv is None:
            assert spec.payload is not None
            argv = [sys.executable, "-m", "fray.process._jobmain", str(payload), str(failure_path)]
        private_dir(task_dir)  # the failure file's, and the task's working directory by default
        assert argv is not None
        task = TaskProcess(assignment, None, failure_path)
        with self._lock:
            self._tasks[key] = task
        try:  # pip_packages, workspace, docker_image: see fray.cluster.server.envs._environments
            ready = prepare_environment(
                spec, argv, env, spec.environment.workspace or str(task_dir), workdir=self.workdir,
                controller=self.controller, token=self._credential, log=lambda line: self._queue_logs(key, [line]),
            )  # fmt: skip
        except (FrayError, OSError) as exc:  # the job's environment, not the machine: the task fails
            self._cannot_start(key, f"cannot prepare the job's environment: {exc}")
            return
        argv, env, cwd = ready.argv, ready.env, ready.cwd
        # Every task goes through the fork server, which fences it with the worker's lease. A
        # callable task in the worker's own environment runs in a fork of the warm interpreter;
        # anything else (a program, another interpreter or venv, a container, interpreter
        # settings) is executed afresh by the forked child.
        forked_callable = spec.argv is None and ready.forkable and not fresh_interpreter
        request = fork_request(
            ready, spec.payload, payload, failure_path, forked_callable=forked_callable,
            holds_device=spec.resources.device_kind != "cpu",
        )  # fmt: skip
        proc: Process | None = self._fork(request)
        if proc is None:
            try:
                if "payload_data" in request:  # the fresh interpreter reads it from its file
                    write_private(payload, spec.payload or b"")
                proc = subprocess.Popen(
                    argv,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                    preexec_fn=die_with_worker,
                )
            except (OSError, ValueError) as exc:
                self._cannot_start(key, f"cannot start {argv[0]!r}: {exc}")
                return
        self._started(task, proc)

    def _start_forkserver(self) -> ForkServer | None:
        try:
            return ForkServer()
        except OSError as exc:
            logger.warning("cannot start the fork server (%s); tasks start as new processes", exc)
            return None

    def _fork(self, request: dict[str, Any]) -> ForkedProcess | None:
        """Fork the task from the warm fork server; None (start it the slow way) if that fails."""
        try:
            if self._forkserver is None or not self._forkserver.alive:
                if self._forkserver is not None:
                    self._forkserver.close()
                self._forkserver = ForkServer()
                if self._lease_seconds:
                    self._forkserver.renew(self._lease_seconds)
            # The lease loop renews only every 0.25 s: after a lapse, renew now, or the fork
            # server would kill a task started just after contact came back.
            left = self._lease_left()
            if self._lease_seconds and left > 0:
                self._forkserver.renew(left)
            return self._forkserver.launch(request)
        except OSError as exc:
            logger.warning("fork server failed (%s); starting the task as a new process", exc)
            # Stop it now: a fork it finishes late must not run beside the replacement.
            if self._forkserver is not None:
                self._forkserver.close()
                self._forkserver = None
            return None

    def _started(self, task: TaskProcess, proc: Process) -> None:
        task.proc = proc
        if task.handed_back:  # the drain began while it was being started
            _signal_group(proc, signal.SIGKILL)
        with self._lock:
            self._pending.started.append(task.assignment.key)
        self._report_ready.set()  # not urgent: it waits for the exit a moment (_START_GATHER_SECONDS)
        name = f"fray-task-{task.assignment.key}"
        threading.Thread(target=self._watch, args=(task,), name=name, daemon=True).start()

    def _watch(self, task: TaskProcess) -> None:
        proc, key = task.proc, task.assignment.key
        assert proc is not None and proc.stdout is not None
        output = OutputCap()
        try:
            while True:
                line = output.read_line(proc.stdout)
                if line is None:
                    break
                if output.keep(line):
                    self._queue_logs(key, [line])
        except Exception:
            logger.exception("reading the output of task %s failed", key)
        tail = output.finish()
        if tail:
            self._queue_logs(key, tail)
        last = output.last
        code = proc.wait()
        if isinstance(proc, ForkedProcess) and proc.fenced:
            failure: bytes | None = Failure.lost(
                f"worker {self.worker_id} stopped renewing its lease for more than {self._lease_seconds:g}s; "
                "its tasks were killed so that they cannot run beside their replacements"
            ).encode()
        elif task.handed_back and not task.killed:
            # Stopped by the drain, whatever its exit status (a clean exit on SIGTERM is not the job's end):
            # not a failure nor a success of the task. The controller loses it with this worker (a
            # preemption) when the worker leaves; its exit is not reported.
            self._queue_logs(key, [f"[fray] worker {self.worker_id} is leaving ({self._draining}): task stopped, "
                                   "handed back to the controller to run again elsewhere"])  # fmt: skip
            with self._lock:
                self._tasks.pop(key, None)
            return
        else:
            failure = None if code == 0 or task.killed else task.failure(code, last)
        self._record_exit(TaskExit(key, code, failure))

    # ----- reports ------------------------------------------------------------------------------

    def _queue_logs(self, key: TaskKey, lines: list[str]) -> None:
        with self._lock:
            self._pending.logs.setdefault(key, []).extend(lines)
        self._report_ready.set()

    def _record_exit(self, exit_: TaskExit) -> None:
        # The task leaves the running set and enters the journal in one step, so a
        # registration sees it in exactly one of the two.
        with self._lock:
            self._tasks.pop(exit_.key, None)
            self._journal.record(exit_)
        self._report_urgent.set()
        self._report_ready.set()
        # The fsync (~1 ms) overlaps the report: an outcome the controller has recorded needs
        # no file, and one it has not is sent again from memory (see OutcomeJournal.persist).
        self._journal.persist(exit_)

    def _report_loop(self) -> None:
        backoff = 0.05
        while not self._stopping.is_set():
            # Several heartbeats per lease: one delayed answer must not let the lease lapse.
            beat = min(self._heartbeat, self._lease_seconds / 4) if self._lease_seconds else self._heartbeat
            if self._report_ready.wait(beat):
                # Log lines wait a moment for more (a chatty task costs one report per moment, not one
                # per line), a start a little longer for its exit; an exit ends the wait. The starts and
                # exits of a burst gather while a report is on its way: the next report carries them all.
                with self._lock:
                    gather = _START_GATHER_SECONDS if self._pending.started else _REPORT_GATHER_SECONDS
                self._report_urgent.wait(gather)
            self._report_urgent.clear()
            self._report_ready.clear()
            if not self._registered:
                continue  # the command loop registers, with everything a report would carry
            try:
                self._report()
                backoff = 0.05
            except Exception as exc:  # never dies
                logger.debug("report failed (%s); retrying", _describe(exc))
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 2.0)
                self._report_ready.set()

    def _check_health(self) -> None:
        """An unhealthy worker recovers on its own once it can write its task directory again."""
        if not self._health:
            return
        probe = self.workdir / "tasks" / ".probe"
        try:
            write_private(probe, b"ok")
            probe.unlink()
        except OSError:
            return
        logger.info("worker %s can start tasks again", self.worker_id)
        self._health = ""

    def _report(self) -> None:
        self._check_health()
        with self._session:
            if not self._registered:
                return
            with self._lock:
                started, logs = self._pending.take()
                exits = self._journal.pending()
            try:
                report = WorkerReport(started, exits, logs, self._health_note())
                sent = time.monotonic()
                accepted = self._client.report(self.worker_id, self._epoch, report)
                if accepted:
                    self._heard(sent)
            except BaseException:
                with self._lock:
                    self._pending.put_back(started, logs)
                raise
            if accepted:
                self._journal.acknowledge([e.key for e in exits])
            else:
                # Fenced: the controller ended this epoch (it declared us lost). Nothing of the
                # report was recorded; the registration carries the outcomes again.
                with self._lock:
                    self._pending.put_back(started, logs)
                self._registered = False

    def _health_note(self) -> str:
        """What the controller is told about this worker's ability to take tasks ("" when it can)."""
        return f"draining ({self._draining}): takes no new tasks" if self._draining else self._health

    def _beat(self, timeout: float) -> None:
        """One keep-alive (see :mod:`._keepalive`): an empty report, outside the session, limited to ``timeout``."""
        if not self._registered:
            return
        sent = time.monotonic()
        # Refused (its epoch just ended): nothing to do here, the report and command loops re-register.
        if self._client.with_timeout(timeout).report(
            self.worker_id, self._epoch, WorkerReport(health=self._health_note())
        ):
            self._heard(sent)

    def _lease_left(self) -> float:
        """Seconds the tasks may still run on the controller's last answer (not positive: lapsed)."""
        with self._lock:
            return self._contact + self._lease_seconds - time.monotonic()

    def _heard(self, sent: float) -> None:
        """The controller answered a request sent at ``sent``: the lease may run from there."""
        with self._lock:
            moved = sent > self._contact
            self._contact = max(self._contact, sent)
        if moved:
            self._contact_moved.set()

    def _lease_loop(self) -> None:
        while not self._stopping.is_set():
            self._contact_moved.clear()  # a contact from here on wakes the wait below
            lease, server = self._lease_seconds, self._forkserver
            if lease and server is not None and server.alive:
                with self._lock:
                    left = self._contact + lease - time.monotonic()
                try:
                    if left > 0:  # else it lapses: cut off for too long, the tasks must stop
                        server.renew(left)
                except Exception as exc:  # never dies; the fork server is restarted on the next launch
                    logger.debug("cannot renew the lease (%s)", exc)
            # Also woken by every new contact: a lease about to lapse is renewed the moment contact is back.
            self._contact_moved.wait(min(0.25, lease / 4) if lease else 0.25)


def _signal_group(proc: Process | None, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group ``proc`` leads (to ``proc`` alone if it has none yet)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
    except PermissionError:
        pass


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
