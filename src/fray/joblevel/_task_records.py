"""The records a :class:`~fray.joblevel._task_owner.TaskOwner` keeps: objects, tasks, workers, their requests; launchers.

Plain mutable records, touched only under the owner's lock.
"""

from __future__ import annotations

import concurrent.futures
import threading
from multiprocessing.connection import Connection
from typing import Any, Protocol

__all__ = [
    "NO_VALUE",
    "PENDING",
    "START_FAILURES",
    "VALUE_KINDS",
    "Launcher",
    "ObjectRecord",
    "Request",
    "TaskRecord",
    "WorkerRecord",
]

PENDING = None
#: The kinds of a finished object that hold a value (the others hold why there is none).
VALUE_KINDS = frozenset({"ok", "bytes"})
NO_VALUE: Any = object()
#: Consecutive workers that die before connecting, after which queued tasks fail instead of retrying.
START_FAILURES = 3


class Launcher(Protocol):
    """Where a :class:`TaskOwner`'s workers come from."""

    def start(self, request: dict[str, Any]) -> None:
        """Start worker ``request["wid"]``, which connects to ``request["address"]`` (called with the owner's lock
        held: must not block). A worker that ends before it connects is reported with ``owner.start_failed``."""
        ...

    def death_note(self, wid: int, pid: int) -> str:
        """How worker ``wid`` (process ``pid``) ended, for messages ("signal 9"), or ""; may wait briefly."""
        ...

    def close(self) -> None:
        """Stop starting workers and release what the launcher holds."""
        ...


class ObjectRecord:
    __slots__ = ("dependents", "frames", "future", "holders", "kind", "pinned", "refs", "users", "value", "watchers")

    def __init__(self, pinned: bool) -> None:
        self.kind: str | None = PENDING  # then "ok"/"bytes", "error", "lost", "gone" (value_of)
        self.frames: list[Any] = []  # the value's frames (see fray.joblevel._objects), or one message/failure
        self.value = NO_VALUE
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.refs = 0  # live refs in this process (counted only for objects made here)
        self.users = 0  # unfinished tasks taking it as an argument
        self.pinned = pinned
        self.holders: set[int] = set()  # workers holding its bytes
        self.dependents: list[TaskRecord] = []
        self.watchers: list[Request] = []


class TaskRecord:
    __slots__ = ("args_blob", "deps", "finished", "fn_blob", "fn_key", "name", "task_id", "waiting")

    def __init__(self, task_id: str, name: str, fn_key: str, fn_blob: bytes | None, args_blob: bytes) -> None:
        self.task_id = task_id
        self.name = name
        self.fn_key = fn_key
        self.fn_blob = fn_blob  # only for callables pickled per submission
        self.args_blob = args_blob
        self.deps: list[str] = []
        self.waiting = 0
        self.finished = False


class WorkerRecord:
    __slots__ = ("blocked", "cached", "conn", "fn_keys", "lock", "pid", "requests", "task", "wid")

    def __init__(self, wid: int, conn: Connection, pid: int) -> None:
        self.wid = wid
        self.conn = conn
        self.lock = threading.Lock()
        self.pid = pid
        self.task: TaskRecord | None = None
        self.blocked = 0  # its task's get/wait requests in progress
        self.cached: set[str] = set()
        self.fn_keys: set[str] = set()
        self.requests: dict[int, Request] = {}


class Request:
    __slots__ = ("count", "done", "ids", "num_returns", "rid", "worker")

    def __init__(self, worker: WorkerRecord, rid: int, ids: list[str], num_returns: int | None) -> None:
        self.worker = worker
        self.rid = rid
        self.ids = ids
        self.num_returns = num_returns  # None for a get
        self.count = 0  # get: objects still pending; wait: objects ready
        self.done = False

    @property
    def satisfied(self) -> bool:
        """True once the worker can have its answer."""
        return self.count == 0 if self.num_returns is None else self.count >= self.num_returns
