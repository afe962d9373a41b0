"""One replica of a job run as a process on this host: shared by the backends that start jobs as subprocesses.

:class:`ReplicaProcess` starts the replica in its own session (so terminating it
reaches every process it started), streams its output into the job's
:class:`~fray.core.inside._logcapture.LogBuffer`, and turns how it ended into ``None`` (success)
or a :class:`~fray.core._lifecycle.Failure`: the user's exception when a callable wrote
one to its failure file (see :mod:`fray.process._jobmain`), else the exit code and the
last lines the replica printed. :func:`callable_argv` builds the command line that
runs a pickled callable entrypoint with :mod:`fray.process._jobmain`. A replica of
several processes (``JobRequest.processes_per_task``) runs under the supervisor of
:mod:`fray.process._ranks`, which is then the one process seen here.

Thread-safety: :meth:`ReplicaProcess.run` blocks its caller (one thread per replica);
:meth:`ReplicaProcess.kill` may be called from any thread, before, during or after
``run``; a replica killed before it started never starts. Replicas still running when
the interpreter exits are killed with their process groups: none outlives its client.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from fray.core._death import LAST_LINES
from fray.core._lifecycle import Failure
from fray.core.inside._logcapture import LogBuffer
from fray.job import JobInfo
from fray.job_info import replica_env
from fray.process._process import die_with_parent, kill_process_group
from fray.process._ranks import RANK_VARS, ranked_argv

__all__ = ["TAIL_LINES", "ReplicaProcess", "callable_argv"]

#: How many of a replica's last output lines a failure message quotes.
TAIL_LINES = LAST_LINES

# Replicas started by this process and maybe still running, for the exit-time reaper.
_LIVE: weakref.WeakSet[ReplicaProcess] = weakref.WeakSet()


def callable_argv(payload: Path, failure: Path) -> list[str]:
    """The command that runs the cloudpickled entrypoint in ``payload`` and reports an exception to ``failure``."""
    return [sys.executable, "-m", "fray.process._jobmain", str(payload), str(failure)]


class ReplicaProcess:
    """One replica process: start it, stream its output, kill its process group, say how it ended.

    It runs with this process's environment plus :func:`~fray.job.replica_env` of
    ``info`` (who it is), ``client_spec`` (the backend ``current_client()`` finds there)
    and ``user_env``. ``label`` names the replica in a failure message (the binary's
    command, or the callable's name). ``failure_path`` is where a callable replica
    writes its encoded exception; a binary replica has none. ``processes`` copies of
    ``argv`` run side by side under :mod:`fray.process._ranks`, sharing out the replica's
    ``gpus``.
    """

    def __init__(
        self,
        argv: Sequence[str],
        info: JobInfo,
        client_spec: str,
        logs: LogBuffer,
        *,
        label: str,
        user_env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        failure_path: Path | None = None,
        processes: int = 1,
        gpus: int = 0,
    ) -> None:
        self.argv = ranked_argv(argv, processes, gpus=gpus, failure=failure_path)
        self.processes = processes  # more than one: the process seen here supervises the ranks
        # This process's environment (but the rank it may have as a process of a job itself), then
        # the replica's own (identity, backend, the user's variables).
        inherited = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
        self.env = {**inherited, **replica_env(info, client_spec, user_env)}
        self.logs = logs
        self.label = label
        self.cwd = cwd
        self.failure_path = failure_path
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._killed = False
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    @property
    def pid(self) -> int | None:
        """The replica's process id once started (it leads its own process group)."""
        proc = self._proc
        return proc.pid if proc is not None else None

    @property
    def killed(self) -> bool:
        """True once :meth:`kill` was called."""
        return self._killed

    def kill(self, *, at_once: bool = False) -> None:
        """Stop the replica and everything it started: SIGTERM its process group, SIGKILL after a grace period.

        ``at_once`` sends SIGKILL straight away, as a lost host gives no warning (a preemption).
        A replica killed before it started never starts.
        """
        with self._lock:
            self._killed = True
            proc = self._proc
        if proc is None:
            return
        if at_once:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        else:
            kill_process_group(proc)

    def run(self) -> Failure | None:
        """Start the replica, stream its output until it exits, and say how it ended.

        Returns ``None`` when it exited 0 (or was killed before it started: the
        caller knows it killed it), else the :class:`Failure`.
        """
        if self._killed:  # killed before it started: it never starts
            return None
        try:
            proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,  # its own process group, so kill() reaches its children too
                # Ends with the driver even when that is killed outright (atexit then reaps nothing).
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
            )
        except OSError as exc:
            return Failure(f"cannot start {self.label!r}: {exc}", original=exc)
        with self._lock:
            self._proc = proc
            killed = self._killed
        _LIVE.add(self)
        if killed:
            kill_process_group(proc)
        self._stream(proc)
        code = proc.wait()
        if code == 0:
            return None
        written = self._read_failure()
        if written is not None:
            return written.with_last_lines(list(self._tail))
        return Failure.from_exit(self.label, code, list(self._tail))

    def _stream(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        writer = self.logs.writer()
        echo = self.logs.echo
        with proc.stdout:
            for raw in proc.stdout:
                text = raw.decode(errors="replace")
                writer.write(text)
                self._tail.append(text.rstrip("\n"))
                if echo:
                    print(text, end="", flush=True)
        if writer.partial:  # output that did not end its last line is still output
            writer.write("\n")

    def _read_failure(self) -> Failure | None:
        if self.failure_path is None:
            return None
        try:
            data = self.failure_path.read_bytes()
        except OSError:
            return None
        try:
            return Failure.decode(data)
        except (ValueError, KeyError):  # not a failure _jobmain wrote (a torn or foreign file)
            return None


@atexit.register
def _reap_at_exit() -> None:
    # Threads die with the interpreter but processes in their own sessions would not: never leave orphans.
    for replica in list(_LIVE):
        proc = replica._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
