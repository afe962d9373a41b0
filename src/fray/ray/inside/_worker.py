"""What runs inside Ray worker processes for jobs (actors: see ``_actor_host``).

It gives user code the Fray view of where it runs: :func:`fray.current_job` (through
the ``FRAY_*`` environment variables of :func:`fray.job.job_env`) and
:func:`fray.current_client` (through ``FRAY_CLIENT_SPEC``, naming the same cluster
and namespace). A Ray worker runs one task at a time, so a task's variables are set
for its duration and restored afterwards.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import cloudpickle

from fray.core._lifecycle import exit_status
from fray.core._remote import RemoteFailure
from fray.core.inside._logcapture import TaskOutput, capture_to
from fray.core.inside._stacks import serve

__all__ = [
    "REPORTER",
    "STARTED_AFTER",
    "JobOutcome",
    "kill_replica",
    "replica_arguments",
    "run_job_replica",
    "started_key",
]

STARTED_AFTER = 0.05
"""Seconds a replica must have been running before it reports itself started.

The report is a write to Ray's GCS key-value store; short jobs finish before it is
due and never pay for it, so Fray adds nothing to the cost of a quick task.
"""

KV_NAMESPACE = "fray"


def started_key(job_uid: str, attempt: int, replica: int) -> bytes:
    """The GCS key under which a replica of an attempt reports that it is running."""
    return f"started/{job_uid}/{attempt}/{replica}".encode()


class _StartedReporter:
    """One daemon thread per worker process that reports long-running replicas as started.

    It checks every :data:`_TICK` seconds while there is work and for a while after,
    and only then goes to sleep until woken: waking it for every task would cost a
    thread switch per task, a noticeable part of a quick task's cost.
    """

    _TICK = 0.02
    _LINGER = 2.0  # seconds of ticking after the last replica, before sleeping until woken

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[bytes, float] = {}
        self._thread: threading.Thread | None = None
        self._asleep = False
        self._inflight: set[bytes] = set()
        self._reported: set[bytes] = set()

    def schedule(self, key: bytes) -> None:
        with self._cond:
            self._pending[key] = time.monotonic() + STARTED_AFTER
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fray-started-reporter", daemon=True)
                self._thread.start()
            elif self._asleep:
                self._cond.notify()

    def cancel(self, key: bytes) -> bool:
        """Forget ``key``; True if it was reported (then the caller deletes it)."""
        with self._cond:
            if self._pending.pop(key, None) is not None:
                return False
            while key in self._inflight:  # being written right now: wait, or the delete could come first
                self._cond.wait()
            if key in self._reported:
                self._reported.discard(key)
                return True
            return False

    def _run(self) -> None:
        from ray.experimental import internal_kv

        last_work = time.monotonic()
        while True:
            with self._cond:
                now = time.monotonic()
                if self._pending:
                    last_work = now
                elif now - last_work > self._LINGER:
                    self._asleep = True
                    self._cond.wait()
                    self._asleep = False
                    continue
                due = [key for key, at in self._pending.items() if at <= now]
                for key in due:
                    del self._pending[key]
                self._inflight.update(due)
            for key in due:
                with contextlib.suppress(Exception):  # a status hint must never break the job
                    internal_kv._internal_kv_put(key, _whereabouts(), namespace=KV_NAMESPACE)
            if due:
                with self._cond:
                    self._inflight.difference_update(due)
                    self._reported.update(due)
                    self._cond.notify_all()
            with self._cond:  # a ticking clock; schedule() only wakes a sleeping reporter
                self._cond.wait(self._TICK)


REPORTER = _StartedReporter()
"""This process's reporter: of replicas here, and of job-context tasks (``fray.ray.context``) for ``stacks()``."""

_WHEREABOUTS: list[bytes] = []


def _whereabouts() -> bytes:
    """What a started key holds: this worker process's pid and Ray node id (where preempt() and stacks() find it)."""
    if not _WHEREABOUTS:
        import ray

        _WHEREABOUTS.append(f"{os.getpid()} {ray.get_runtime_context().get_node_id()}".encode())
    return _WHEREABOUTS[0]


def kill_replica(key: bytes, pid: int) -> bool:
    """SIGKILL worker process ``pid`` if it still runs the replica of ``key`` (a Ray task on pid's node).

    This is ``fray.testing.preempt`` on Ray: the replica's worker dies as on a lost
    host, and Ray reports the replica's task as a crashed worker (a preemption).
    """
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_exists(key, namespace=KV_NAMESPACE):
        return False  # the replica ended meanwhile (its key went with it)
    os.kill(pid, signal.SIGKILL)
    return True


# Each variable's value in this process before any replica changed it. Every replica
# restores what it set, so between replicas the process is back at these values; reading
# them once per process, not once per replica, saves a system-level lookup per variable.
_baseline: dict[str, str | None] = {}


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    # Only what differs is set and restored: each is a putenv, and Ray's workers already
    # run with some of these (PYTHONUNBUFFERED).
    environ = os.environ
    changed: list[str] = []
    for key, value in env.items():
        if key not in _baseline:
            _baseline[key] = environ.get(key)
        if _baseline[key] != value:
            environ[key] = value
            changed.append(key)
    try:
        yield
    finally:
        for key in changed:
            original = _baseline[key]
            if original is not None:
                environ[key] = original
            elif key in environ:
                del environ[key]


# What a replica returns: None (it returned and printed nothing), ("ok", log text), or
# ("error", log text, RemoteFailure.encode() of what it raised).
JobOutcome = tuple[Any, ...] | None


# Pickled function -> function, so repeated jobs skip unpickling it. Like Ray, which
# loads a remote function once per worker; callable objects, which may carry state
# from one job to the next, are unpickled fresh every time.
_functions: dict[bytes, Any] = {}


def _load_callable(pickled: bytes) -> Any:
    fn = _functions.get(pickled)
    if fn is None:
        fn = cloudpickle.loads(pickled)
        if isinstance(fn, types.FunctionType | types.BuiltinFunctionType):
            if len(_functions) >= 128:
                _functions.clear()
            _functions[pickled] = fn
    return fn


def replica_arguments(pickled_fn: bytes, pickled_args: bytes, env: dict[str, str], key: bytes) -> tuple[bytes]:
    """The arguments of the Ray task running one replica: one blob, since every Ray argument has a cost.

    The function and its arguments were pickled once, at submission (to check them);
    this wraps those bytes with the replica's environment and status key.
    """
    return (pickle.dumps((pickled_fn, pickled_args, env, key), protocol=pickle.HIGHEST_PROTOCOL),)


def run_job_replica(replica: bytes) -> JobOutcome:
    """Run one replica of a callable job (the body of the Ray task Fray submits).

    ``replica`` comes from :func:`replica_arguments`. User exceptions are returned, not
    raised, so the driver can tell them from a lost worker (which Ray reports as an
    error of the task itself) and apply the right retry budget.
    """
    pickled_fn, pickled_args, env, key = pickle.loads(replica)
    serve()  # the replica's process answers stacks() (fray.ray._stacks): one idle thread until somebody asks
    output = TaskOutput()
    REPORTER.schedule(key)
    try:
        with _environment(env), capture_to(output):
            try:
                fn = _load_callable(pickled_fn)
                args, kwargs = cloudpickle.loads(pickled_args)
                fn(*args, **kwargs)
            except BaseException as exc:
                if exit_status(exc) != 0:  # sys.exit(0) ends a job as cleanly as returning does
                    failure = RemoteFailure.capture(exc)
                    sys.stderr.write(failure.traceback_text)
                    return ("error", output.text(), failure.encode())
    finally:
        if REPORTER.cancel(key):
            # Only replicas that ran STARTED_AFTER seconds get here, so this costs quick ones nothing.
            with contextlib.suppress(Exception):
                from ray.experimental import internal_kv

                internal_kv._internal_kv_del(key, namespace=KV_NAMESPACE)
    text = output.text()
    return ("ok", text) if text else None
