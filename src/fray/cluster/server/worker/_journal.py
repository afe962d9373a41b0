"""The worker's durable record of task outcomes the controller has not acknowledged yet.

A task's exit is kept here in memory at once (every report and registration sends what
is here) and written to disk (one small file per task attempt, fsynced, renamed into place)
while its report is on its way; it is removed only once the controller has recorded it.
Whatever happens in between -- a controller outage of any length, a report lost with a
broken connection, a re-registration, the worker process itself restarting -- the
outcome is sent again until it is acknowledged, and the controller, which reconciles
by task attempt, records it exactly once.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import threading
from pathlib import Path

from fray.cluster.protocol.messages import TaskExit
from fray.cluster.protocol.records import TaskKey
from fray.core._private_files import private_dir, write_private

__all__ = ["OutcomeJournal"]

logger = logging.getLogger(__name__)


class OutcomeJournal:
    """Unacknowledged :class:`TaskExit` s, in memory and on disk under ``directory`` (mode 0700)."""

    def __init__(self, directory: Path) -> None:
        self.directory = private_dir(directory)
        self._lock = threading.Lock()
        self._exits: dict[TaskKey, TaskExit] = {}
        for path in sorted(directory.glob("*.json")):
            try:
                exit_ = _decode(path.read_bytes())
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.warning("ignoring unreadable outcome %s: %s", path, exc)
                continue
            self._exits[exit_.key] = exit_

    def record(self, exit_: TaskExit) -> None:
        """Keep ``exit_`` until it is acknowledged; :meth:`persist` puts it on disk."""
        with self._lock:
            self._exits[exit_.key] = exit_

    def persist(self, exit_: TaskExit) -> None:
        """Write the recorded ``exit_`` to disk, fsynced (a write error is logged: it stays in memory).

        It may be sent, and even acknowledged, meanwhile: a report need not wait for the
        disk, since an outcome the controller has recorded needs no file, and one it has not
        is sent again from memory. An outcome acknowledged while it was being written loses
        its file again here, so no stale file is left behind.
        """
        path = self._path(exit_.key)
        try:
            write_private(path, _encode(exit_), durable=True)
        except OSError as exc:
            logger.error("cannot write task outcome %s to %s (%s); it is kept in memory only", exit_.key, path, exc)
            return
        with self._lock:
            acknowledged = exit_.key not in self._exits
        if acknowledged:  # acknowledge() ran before the file existed
            with contextlib.suppress(OSError):
                path.unlink()

    def pending(self) -> list[TaskExit]:
        """Every outcome not acknowledged yet, oldest task first."""
        with self._lock:
            return list(self._exits.values())

    def acknowledge(self, keys: list[TaskKey]) -> None:
        """The controller recorded these outcomes: forget them."""
        with self._lock:
            for key in keys:
                self._exits.pop(key, None)
        for key in keys:
            with contextlib.suppress(OSError):
                self._path(key).unlink()

    def __contains__(self, key: TaskKey) -> bool:
        with self._lock:
            return key in self._exits

    def _path(self, key: TaskKey) -> Path:
        # Hashed: nested job ids can be longer than a file name may be.
        name = hashlib.sha256(f"{key.job_id}\0{key.task_index}\0{key.attempt}".encode()).hexdigest()[:40]
        return self.directory / f"{name}.json"


def _encode(exit_: TaskExit) -> bytes:
    key = exit_.key
    failure = None if exit_.failure is None else base64.b64encode(exit_.failure).decode()
    record = {"job_id": key.job_id, "task_index": key.task_index, "attempt": key.attempt}
    return json.dumps({**record, "exit_code": exit_.exit_code, "failure": failure}).encode()


def _decode(data: bytes) -> TaskExit:
    record = json.loads(data)
    failure = record["failure"]
    key = TaskKey(str(record["job_id"]), int(record["task_index"]), int(record["attempt"]))
    return TaskExit(key, int(record["exit_code"]), None if failure is None else base64.b64decode(failure))
