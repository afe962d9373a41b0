"""Stopping process trees: shared by every backend that runs jobs as processes."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import Protocol

_PR_SET_PDEATHSIG = 1
# The interpreter's own symbols include libc's; ctypes.util.find_library would run ``ldconfig``
# in a subprocess (milliseconds) to find the same library.
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None

#: Seconds a process group gets to exit after SIGTERM before it is sent SIGKILL.
KILL_GRACE = 3.0


class Process(Protocol):
    """What :func:`kill_process_group` needs of a process: a ``subprocess.Popen`` has it."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def die_with_parent(parent: int | None = None) -> None:
    """Run in a child after fork: when the thread that started it dies -- with its process, even by
    SIGKILL -- the child gets SIGKILL too (Linux's parent-death signal; elsewhere nothing happens).

    Otherwise a job's process would run on as an orphan after its driver or worker was killed.
    ``parent`` is the pid that forked: a child whose parent died before the signal was armed
    ends at once (the signal would never come).
    """
    if _libc is None:
        return
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def kill_process_group(proc: Process, grace: float = KILL_GRACE) -> None:
    """SIGTERM the process group led by ``proc`` now, SIGKILL it after ``grace`` seconds.

    ``proc`` must have been started with ``start_new_session=True``. Returns at once;
    the escalation runs on a daemon thread.
    """
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        # No such group yet (a process still setting itself up): signal the process itself,
        # and escalate all the same.
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return

    def escalate() -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        # The leader may be gone while children it started still hold the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)

    threading.Thread(target=escalate, name=f"fray-kill-{proc.pid}", daemon=True).start()


def describe_exit(code: int) -> str:
    """``exit code 3`` or ``killed by SIGSEGV``: :func:`fray.core._death.describe_exit`, the words of every backend."""
    from fray.core._death import describe_exit as words

    return words(code)


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a running process (a zombie, which has exited already, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:  # no /proc here, or it vanished between the two looks
        return not os.path.exists("/proc")
