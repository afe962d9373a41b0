"""Stopping process trees: shared by every backend that runs jobs as processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from typing import Protocol

#: Seconds a process group gets to exit after SIGTERM before it is sent SIGKILL.
KILL_GRACE = 3.0


class Process(Protocol):
    """What :func:`kill_process_group` needs of a process: a ``subprocess.Popen`` has it."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


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
    """``exit code 3`` or ``killed by signal SIGKILL``."""
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


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
