"""Who a process is: PID, start time and command line, so that a recorded PID is never mistaken for another.

``fray cluster up`` records the identity of every process it starts; ``fray cluster
down`` signals a PID only while it still has that identity. A PID reused by another
program after a crash or a reboot has another start time (and usually another command
line), so it is left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ProcessIdentity", "identify"]


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as it was when recorded: ``start`` is opaque but differs for a reused PID."""

    pid: int
    start: str
    cmdline: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """Plain data for a state file."""
        return {"pid": self.pid, "start": self.start, "cmdline": list(self.cmdline)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessIdentity:
        """The inverse of :meth:`to_json`."""
        return cls(int(data["pid"]), str(data["start"]), tuple(str(part) for part in data["cmdline"]))

    def alive(self) -> bool:
        """True while a process with this PID, start time and command line runs (a zombie does not count)."""
        return identify(self.pid) == self

    def ended(self) -> bool:
        """True once this process is gone: no process with this PID and start time runs, or it is a zombie.

        What to wait on after signalling it: a process on its way out has no command line any
        more (the kernel releases its memory first) while it still holds its files and ports, so
        it is no longer :meth:`alive` but has not ended yet.
        """
        current = identify(self.pid)
        return current is None or current.start != self.start


def _linux(pid: int) -> ProcessIdentity | None:
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    parts = tuple(part.decode(errors="replace") for part in cmdline.split(b"\0") if part)
    return ProcessIdentity(pid, f"{boot}:{fields[19]}", parts)


def _ps(pid: int) -> ProcessIdentity | None:
    out = subprocess.run(
        ["ps", "-o", "stat=", "-o", "lstart=", "-o", "command=", "-p", str(pid)], capture_output=True, text=True
    )
    line = out.stdout.strip()
    if out.returncode != 0 or not line or line.startswith("Z"):
        return None
    parts = line.split()
    # lstart is five words: "Mon Nov  3 10:11:12 2025".
    return ProcessIdentity(pid, " ".join(parts[1:6]), tuple(parts[6:]))


def identify(pid: int) -> ProcessIdentity | None:
    """The identity of the running process ``pid``, or None if there is none (or it is a zombie)."""
    if pid <= 0:
        return None
    if sys.platform.startswith("linux") and os.path.isdir("/proc"):
        return _linux(pid)
    return _ps(pid)
