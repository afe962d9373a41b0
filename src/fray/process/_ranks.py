"""N processes of one replica (``JobRequest.processes_per_task``): one supervisor, shared by every backend.

``python -m fray.process._ranks --nproc N [--gpus K] [--failure PATH] -- ARGV...`` runs ``N``
copies of ``ARGV`` side by side and is, to whoever started it, the replica's one process:

* each copy gets its rank in its environment (:data:`RANK_VARS`): ``FRAY_LOCAL_PROCESS_INDEX``
  (0..N-1) and ``FRAY_LOCAL_PROCESS_COUNT`` (N), and ``FRAY_PROCESS_INDEX`` (replica index x N +
  local index) and ``FRAY_PROCESS_COUNT`` (replicas x N) from the replica's own
  ``FRAY_REPLICA_INDEX``/``FRAY_REPLICA_COUNT``; :func:`fray.current_job` reads them;
* with ``--gpus K`` (the replica holds K GPUs) each copy sees its contiguous share of them in
  ``CUDA_VISIBLE_DEVICES`` (of the replica's own list if it has one, else of ``0..K-1``);
* every line a copy prints (stdout and stderr, merged) is written to the supervisor's stdout
  prefixed with ``[proc I] ``, I its local index (:func:`tag`);
* the first copy to fail (non-zero exit, or killed by a signal) fails the replica: the others
  get SIGTERM, and SIGKILL after :data:`~fray.process._process.KILL_GRACE` seconds; once all have
  exited the supervisor exits with the failing copy's status (killed by the same signal, if it
  was). It succeeds when every copy exits 0;
* SIGTERM, SIGINT and SIGHUP sent to the supervisor are forwarded to the copies (which may
  already have had them from their process group: every copy stays in the supervisor's group,
  so stopping the replica's group reaches them and whatever they started);
* with ``--failure PATH`` (a callable replica's failure file, see :mod:`fray.process._jobmain`)
  copy I is given ``PATH.I`` wherever ``PATH`` is one of its arguments, and the failing copy's
  file becomes ``PATH``: the replica reports the exception of the copy that failed it.

Backends never build the command themselves: :func:`ranked_argv` does (and leaves ``ARGV``
alone for one process), :func:`check_processes` refuses at submit what cannot be split. The
copies die with the supervisor (Linux's parent-death signal), so none outlives a supervisor
killed outright. The loop is one thread that waits on the copies' output and on a wake-up
pipe its signal handlers (SIGCHLD included) write to: no polling, no sleeps.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fray.errors import ConfigError
from fray.job import JobRequest
from fray.process._process import KILL_GRACE, die_with_parent
from fray.resources import GpuConfig

__all__ = ["RANK_VARS", "check_processes", "gpu_shares", "main", "rank_env", "ranked_argv", "supervise", "tag"]

#: The variables that carry a process's rank (see :func:`fray.current_job`); a replica never inherits them.
RANK_VARS = ("FRAY_PROCESS_INDEX", "FRAY_PROCESS_COUNT", "FRAY_LOCAL_PROCESS_INDEX", "FRAY_LOCAL_PROCESS_COUNT")

# What a copy's output is read in; a line longer than this is passed on in pieces, each tagged.
_CHUNK = 1 << 16
# How long output left in the pipes is still passed on once every copy has exited.
_DRAIN_SECONDS = 1.0
# The signals forwarded to the copies; each also begins stopping them (SIGKILL after the grace).
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def ranked_argv(
    argv: Sequence[str],
    processes: int,
    *,
    python: str = sys.executable,
    gpus: int = 0,
    failure: str | os.PathLike[str] | None = None,
) -> list[str]:
    """The command that runs ``argv`` as ``processes`` ranked processes (``argv`` itself for one).

    ``python`` is the interpreter that runs the supervisor (one that can import Fray: the
    replica's own, in a virtual environment or a container); ``gpus`` the GPUs the replica
    holds; ``failure`` a callable replica's failure file (see the module docstring).
    """
    if processes == 1:
        return list(argv)
    command = [python, "-m", "fray.process._ranks", "--nproc", str(processes)]
    if gpus:
        command += ["--gpus", str(gpus)]
    if failure is not None:
        command += ["--failure", os.fspath(failure)]
    return [*command, "--", *argv]


def check_processes(request: JobRequest) -> None:
    """Refuse, at submit, a ``processes_per_task`` that does not split the replica's GPUs evenly."""
    count = request.processes_per_task
    if count == 1:
        return
    for device in request.resources.device_choices:
        if isinstance(device, GpuConfig) and device.count % count:
            raise ConfigError(
                f"job {request.name!r}: processes_per_task={count} must divide the {device.count} GPUs each replica "
                f"holds (GpuConfig(count={device.count})), so that every process gets an equal share in "
                "CUDA_VISIBLE_DEVICES; ask for a multiple of it, or change processes_per_task"
            )


def gpu_shares(visible: Sequence[str], processes: int) -> list[list[str]]:
    """``visible`` GPUs cut into ``processes`` contiguous, equal shares (ValueError if they do not divide)."""
    if len(visible) % processes:
        raise ValueError(f"{len(visible)} GPUs ({','.join(visible)}) do not split into {processes} equal shares")
    size = len(visible) // processes
    return [list(visible[i * size : (i + 1) * size]) for i in range(processes)]


def rank_env(base: Mapping[str, str], local: int, processes: int) -> dict[str, str]:
    """The rank variables of local process ``local`` of ``processes``, from the replica's variables in ``base``."""
    replica = int(base.get("FRAY_REPLICA_INDEX") or 0)
    replicas = int(base.get("FRAY_REPLICA_COUNT") or 1)
    return {
        "FRAY_PROCESS_INDEX": str(replica * processes + local),
        "FRAY_PROCESS_COUNT": str(replicas * processes),
        "FRAY_LOCAL_PROCESS_INDEX": str(local),
        "FRAY_LOCAL_PROCESS_COUNT": str(processes),
    }


def tag(local: int) -> bytes:
    """The prefix of every output line of local process ``local``: ``b"[proc 1] "``."""
    return f"[proc {local}] ".encode()


@dataclass
class _Copy:
    """One of the supervised processes: its rank, its process, what it printed without a newline yet."""

    local: int
    proc: subprocess.Popen[bytes]
    partial: bytes = b""
    code: int | None = None
    prefix: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.prefix = tag(self.local)


def _write(data: bytes) -> None:
    # The replica's own output is what the backend reads; a reader that went away must not stop supervising.
    with contextlib.suppress(OSError):
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]


def _emit(copy: _Copy, data: bytes, final: bool = False) -> None:
    """Pass on ``copy``'s complete lines, tagged; its last partial line too when ``final`` (its output ended)."""
    data = copy.partial + data
    lines = data.split(b"\n")
    copy.partial = lines.pop()
    if (final and copy.partial) or len(copy.partial) >= _CHUNK:
        lines.append(copy.partial)
        copy.partial = b""
    if lines:
        _write(b"".join(copy.prefix + line + b"\n" for line in lines))


class _Supervisor:
    """The loop of :func:`supervise` and what it keeps (see the module docstring)."""

    def __init__(self, argv: Sequence[str], processes: int, gpus: int, failure: str | None) -> None:
        self.argv, self.processes, self.gpus, self.failure = list(argv), processes, gpus, failure
        self.copies: list[_Copy] = []
        self.first: _Copy | None = None  # the copy whose failure fails the replica
        self.kill_at: float | None = None  # when copies still running after SIGTERM get SIGKILL
        self.selector = selectors.DefaultSelector()
        self.signals: list[int] = []
        self._wake_read, self._wake_write = os.pipe()
        for fd in (self._wake_read, self._wake_write):
            os.set_blocking(fd, False)

    def run(self) -> int:
        # Handlers first: a signal that comes while the copies start must not kill the supervisor alone.
        signal.set_wakeup_fd(self._wake_write, warn_on_full_buffer=False)
        for signum in _FORWARDED:
            signal.signal(signum, self._on_signal)
        signal.signal(signal.SIGCHLD, self._on_signal)  # wakes the loop when a copy exits
        self.selector.register(self._wake_read, selectors.EVENT_READ, None)
        try:
            shares = self._shares()
            for local in range(self.processes):
                self._start(local, shares[local] if shares else None)
        except (OSError, ValueError) as exc:
            _write(f"[fray] cannot start process {len(self.copies)} of {self.processes}: {exc}\n".encode())
            self._stop_all()
            self._wait_all()
            return 127
        self._wait_all()
        return self._status()

    def _shares(self) -> list[list[str]] | None:
        if not self.gpus:
            return None
        listed = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        visible = [d.strip() for d in listed.split(",") if d.strip()] if listed else [str(i) for i in range(self.gpus)]
        return gpu_shares(visible, self.processes)

    def _start(self, local: int, gpus: list[str] | None) -> None:
        env = {**os.environ, **rank_env(os.environ, local, self.processes)}
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        argv = self.argv
        if self.failure is not None:
            argv = [f"{self.failure}.{local}" if arg == self.failure else arg for arg in argv]
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # In the supervisor's process group: stopping the replica's group reaches every copy.
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        copy = _Copy(local, proc)
        self.copies.append(copy)
        self.selector.register(proc.stdout, selectors.EVENT_READ, copy)

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum != signal.SIGCHLD:
            self.signals.append(signum)  # handled by the loop, which the wake-up pipe wakes

    def _wait_all(self) -> None:
        """Pass output on and follow the copies until every one has exited; then the output they left."""
        while any(copy.code is None for copy in self.copies):
            timeout = None if self.kill_at is None else max(0.0, self.kill_at - time.monotonic())
            for key, _ in self.selector.select(timeout):
                self._read(key)
            self._handle_signals()
            self._reap()
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                self._kill_all()
        # Whatever the copies wrote before exiting; a process they started may hold a pipe open
        # (and write on), so read only what is there now, for a moment at most.
        drain_until = time.monotonic() + _DRAIN_SECONDS
        while time.monotonic() < drain_until:
            ready = [key for key, _ in self.selector.select(0) if key.data is not None]
            if not ready:
                break
            for key in ready:
                self._read(key)
        for copy in self.copies:
            if copy.partial:
                _emit(copy, b"", final=True)
            if copy.proc.stdout is not None:
                copy.proc.stdout.close()
        self.selector.close()

    def _read(self, key: selectors.SelectorKey) -> None:
        copy: _Copy | None = key.data
        if copy is None:  # the wake-up pipe: a signal came, the loop looks at everything after
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_read, 512):
                    pass
            return
        try:
            data = os.read(key.fd, _CHUNK)
        except BlockingIOError:
            return
        if data:
            _emit(copy, data)
            return
        self.selector.unregister(key.fileobj)
        _emit(copy, b"", final=True)

    def _handle_signals(self) -> None:
        signals, self.signals = self.signals, []
        for signum in signals:
            self._signal_running(signum)
            self._stopping()

    def _reap(self) -> None:
        for copy in self.copies:
            if copy.code is not None:
                continue
            code = copy.proc.poll()
            if code is None:
                continue
            copy.code = code
            if code != 0 and self.first is None:
                self.first = copy
                self._signal_running(signal.SIGTERM)
                self._stopping()

    def _stopping(self) -> None:
        if self.kill_at is None:
            self.kill_at = time.monotonic() + KILL_GRACE

    def _signal_running(self, signum: int) -> None:
        for copy in self.copies:
            if copy.code is None:
                with contextlib.suppress(ProcessLookupError):
                    copy.proc.send_signal(signum)

    def _stop_all(self) -> None:
        self._signal_running(signal.SIGTERM)
        self._stopping()

    def _kill_all(self) -> None:
        self._signal_running(signal.SIGKILL)
        self.kill_at = None  # nothing to wait for any more but the exits SIGKILL brings

    def _status(self) -> int:
        """The replica's exit status: 0, or the failing copy's (negative: killed by that signal)."""
        if self.failure is not None:
            for copy in self.copies:
                own = f"{self.failure}.{copy.local}"
                with contextlib.suppress(OSError):
                    if copy is self.first:
                        os.replace(own, self.failure)
                    else:
                        os.unlink(own)
        if self.first is None:
            return 0
        assert self.first.code is not None
        return self.first.code


def supervise(argv: Sequence[str], processes: int, *, gpus: int = 0, failure: str | None = None) -> int:
    """Run ``argv`` as ``processes`` ranked processes until all have exited; the replica's status.

    0 when every process exited 0; else the status of the first that failed, negative when it
    was killed by a signal (``subprocess``'s convention). Installs signal handlers: call it
    from the main thread of a process of its own (what :func:`main` is).
    """
    if processes < 1:
        raise ValueError(f"--nproc {processes} must be >= 1")
    return _Supervisor(argv, processes, gpus, failure).run()


def _exit_like(status: int) -> int:
    """Exit as the failing process did: killed by the same signal (as its parent would see it), or its code."""
    if status >= 0:
        return status
    signum = -status
    with contextlib.suppress(ValueError, OSError):  # SIGKILL and SIGSTOP keep their action whatever we say
        signal.signal(signum, signal.SIG_DFL)
    with contextlib.suppress(ValueError, OSError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    return 128 + signum  # a signal that does not end a process (SIGCHLD, SIGCONT, ...) as the shell says it


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fray.process._ranks --nproc N [--gpus K] [--failure PATH] -- ARGV...``."""
    parser = argparse.ArgumentParser(
        prog="python -m fray.process._ranks", description="Run a command as N ranked processes of one replica."
    )
    parser.add_argument("--nproc", type=int, required=True, help="how many processes of ARGV to run")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs the replica holds, shared out among them")
    parser.add_argument("--failure", default=None, help="the callable replica's failure file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ARGV...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.nproc < 1:
        parser.error("give --nproc N >= 1 and the command after --")
    return _exit_like(supervise(command, args.nproc, gpus=args.gpus, failure=args.failure))


if __name__ == "__main__":
    sys.exit(main())
