"""``ProcessJobContext``: the job level on worker processes of this machine (real parallelism).

Workers are forked by a warm fork server (:mod:`fray.joblevel._task_worker`): ~1 ms per worker
once the server runs (~60 ms to start it), against ~70 ms to start and import a
fresh interpreter per worker (measured on 2 cores; see ``docs/job-level.md``). That
matters beyond the first start: a task waiting on nested tasks gets a worker started
beside it, and a dead worker is replaced on demand. The owner side -- objects,
scheduling, nested tasks, lost workers -- is :class:`~fray.joblevel._task_owner.TaskOwner`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from typing import Any

from fray.joblevel._task_owner import TaskOwner
from fray.joblevel._task_worker import AUTHKEY_VARIABLE

__all__ = ["ProcessJobContext"]

# Not ``-m fray.joblevel._task_worker``: the user's functions defined in ``__main__`` must not meet Fray's module there.
_SERVER_MAIN = "import sys; from fray.joblevel._task_worker import main; main(sys.argv)"


class _ForkLauncher:
    """Workers forked by one fork server; it reports each worker's pid and, later, how it exited."""

    def __init__(self, owner: ProcessJobContext, authkey: bytes) -> None:
        self._owner = owner
        answers_r, answers_w = os.pipe()
        self._server = subprocess.Popen(
            [sys.executable, "-c", _SERVER_MAIN, str(answers_w)],
            stdin=subprocess.PIPE,
            env={**os.environ, AUTHKEY_VARIABLE: authkey.hex()},
            pass_fds=[answers_w],
            start_new_session=True,
        )
        os.close(answers_w)
        self._changed = threading.Condition()
        self._pids: dict[int, int] = {}  # wid -> pid
        self._codes: dict[int, int] = {}  # pid -> exit code (negative: the signal)
        self._closed = False
        threading.Thread(target=self._read, args=(answers_r,), name="fray-fork-answers", daemon=True).start()

    @property
    def server(self) -> subprocess.Popen[bytes]:
        """The fork server's process."""
        return self._server

    def start(self, request: dict[str, Any]) -> None:
        assert self._server.stdin is not None
        request = {**request, "path": list(sys.path), "cwd": os.getcwd()}
        self._server.stdin.write(json.dumps(request).encode() + b"\n")
        self._server.stdin.flush()

    def _read(self, fd: int) -> None:
        with open(fd, "rb") as answers:
            for line in answers:
                message = json.loads(line)
                with self._changed:
                    if "started" in message:
                        self._pids[message["started"]] = message["pid"]
                    else:
                        self._codes[message["exited"]] = message["code"]
                    self._changed.notify_all()
                if "exited" in message:
                    gone = [wid for wid, pid in self._pids.items() if pid == message["exited"]]
                    for wid in gone:  # the owner ignores workers that had connected
                        self._owner.start_failed(wid, f"exit code {message['code']}; see their output above")

    def death_note(self, wid: int, pid: int) -> str:
        # The connection closes a moment before the fork server reaps the process: wait for its word.
        with self._changed:
            self._changed.wait_for(lambda: pid in self._codes or self._closed, timeout=2.0)
            code = self._codes.get(pid)
        if code is None:
            return ""
        return f"exit code {code}" if code >= 0 else f"signal {-code}"

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        with contextlib.suppress(OSError):
            assert self._server.stdin is not None
            self._server.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._server.wait(5)


class ProcessJobContext(TaskOwner):
    """The job level on worker processes of this machine: see :mod:`fray.joblevel._task_owner`.

    ``num_workers`` (default: the CPU count) is how many tasks run at once. Functions,
    arguments and results must be picklable (they cross processes; a function defined
    in ``__main__`` travels by value). ``resources`` of ``create_task`` are accepted
    and not enforced. Worker output goes to this process's stdout/stderr. Workers
    import modules from this process's ``sys.path`` and current directory.
    ``client`` is where ``create_actor`` creates actors (default: the current client).
    """

    def __init__(self, num_workers: int | None = None, *, client: Any = None) -> None:
        super().__init__("procs", os.cpu_count() or 1 if num_workers is None else num_workers, client=client)
        self._forks: _ForkLauncher | None = None

    def _launcher_for(self, address: Any, authkey: bytes) -> _ForkLauncher:
        self._forks = _ForkLauncher(self, authkey)
        return self._forks

    @property
    def _server(self) -> subprocess.Popen[bytes] | None:
        return self._forks.server if self._forks is not None else None
