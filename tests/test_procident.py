"""A recorded process identity: still alive, or ended -- and a process on its way out is neither."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from fray.process._procident import identify
from support import wait_until


def test_a_process_has_ended_only_once_it_is_gone_or_a_zombie() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Identified once it runs its program: read between fork and exec, the command line is not yet its own.
        identity = wait_until(
            lambda: (found := identify(proc.pid)) is not None and "time.sleep(60)" in " ".join(found.cmdline) and found,
            what="the child to run its program",
        )
        assert identity.alive() and not identity.ended()
        # What a process on its way out looks like: the same PID and start time, but not the
        # recorded command line (the kernel released its memory first, and with it the command
        # line, while it still holds its files and ports). Waiting for it to stop must go on.
        exiting = dataclasses.replace(identity, cmdline=())
        assert not exiting.alive() and not exiting.ended()
        # The same PID started at another time is another process: the recorded one has ended.
        assert dataclasses.replace(identity, start=identity.start + "0").ended()
        proc.kill()
        wait_until(identity.ended, what="the killed process to end")  # a zombie until reaped: ended
        assert not identity.alive()
    finally:
        proc.kill()
        proc.wait()
