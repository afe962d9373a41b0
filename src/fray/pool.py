"""``WorkerPool``: a set of worker jobs, scaled with a queue's backlog, replaced when they die.

Workers are plain jobs built from a template :class:`~fray.job.JobRequest`; the pool
only decides how many run. Their code is the user's: pop an item with a lease, work,
push the result to a result queue, ``done`` the lease. A worker that dies mid-item
loses nothing: its lease runs out and the item is delivered again.

The scaling rule, checked every ``interval`` seconds::

    backlog = queue.counts().unfinished    # waiting + leased, read at one instant
    wanted  = clamp(ceil(backlog / items_per_worker), min_workers, max_workers)

* fewer live workers than ``wanted``: submit the difference at once;
* more than ``wanted``: stop one worker (the newest) once the surplus has lasted
  ``scale_down_after`` seconds, then wait that long again before the next (a stopped
  worker's item, if it had one, is redelivered when its lease runs out);
* a worker whose job ended (failed, stopped, or returned) is dropped and replaced by
  the rule above; after consecutive failures the pool waits 1, 2, 4 ... up to 60 s
  before submitting again (a worker that keeps crashing is not restarted in a tight loop).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import sys
import threading
import time
from typing import Any

from fray.errors import ConfigError, FrayError
from fray.job import JobHandle, JobRequest, JobStatus
from fray.queue import Queue

__all__ = ["WorkerPool"]

_MAX_BACKOFF = 60.0


class WorkerPool:
    """Run between ``min_workers`` and ``max_workers`` copies of ``request_template`` for ``queue``.

    Worker ``n`` is submitted as ``request_template`` named ``{name}-{n}``. Starts at
    once (``min_workers`` right away); :meth:`shutdown` stops every worker. See the
    module docstring for the rule.
    """

    def __init__(
        self,
        client: Any,
        request_template: JobRequest,
        queue: Queue[Any],
        min_workers: int = 0,
        max_workers: int = 1,
        *,
        items_per_worker: int = 1,
        scale_down_after: float = 30.0,
        interval: float = 1.0,
    ) -> None:
        if not isinstance(request_template, JobRequest):
            raise ConfigError(f"WorkerPool(request_template={request_template!r}) must be a JobRequest")
        if not isinstance(queue, Queue):
            raise ConfigError(f"WorkerPool(queue={queue!r}) must be a queue from client.create_queue(...)")
        for label, value, least in (
            ("min_workers", min_workers, 0),
            ("max_workers", max_workers, 1),
            ("items_per_worker", items_per_worker, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"WorkerPool({label}={value!r}) must be a whole number >= {least}")
        if min_workers > max_workers:
            raise ConfigError(f"WorkerPool(min_workers={min_workers}) is more than max_workers={max_workers}")
        for label, seconds in (("scale_down_after", scale_down_after), ("interval", interval)):
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
                raise ConfigError(f"WorkerPool({label}={seconds!r}) must be a number of seconds > 0")
        self.client = client
        self.template = request_template
        self.queue = queue
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.items_per_worker = items_per_worker
        self.scale_down_after = float(scale_down_after)
        self.interval = float(interval)
        self._workers: list[JobHandle] = []
        self._serial = itertools.count(0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._surplus_since: float | None = None
        self._failures = 0
        self._next_submit = 0.0
        #: Worker jobs that ended, in order (the pool replaced them as the rule says).
        self.ended: list[JobHandle] = []
        #: The last exception the pool met while checking or submitting (it keeps going).
        self.last_error: BaseException | None = None
        self.reconcile()
        self._thread = threading.Thread(target=self._run, name=f"fray-pool-{request_template.name}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return (
            f"WorkerPool({self.template.name!r}, workers={len(self._workers)}, {self.min_workers}..{self.max_workers})"
        )

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def workers(self) -> list[JobHandle]:
        """The live worker jobs, oldest first."""
        with self._lock:
            return list(self._workers)

    def wanted(self) -> int:
        """How many workers the rule asks for now."""
        backlog = self.queue.counts().unfinished
        return max(self.min_workers, min(self.max_workers, math.ceil(backlog / self.items_per_worker)))

    def reconcile(self) -> None:
        """Apply the rule once now (the pool's thread does this every ``interval`` seconds)."""
        with self._lock:
            if self._stop.is_set():
                return
            self._drop_ended()
            wanted = self.wanted()
            now = time.monotonic()
            live = len(self._workers)
            if live < wanted:
                self._surplus_since = None
                if now >= self._next_submit:
                    for _ in range(wanted - live):
                        self._workers.append(self._submit())
            elif live > wanted:
                if self._surplus_since is None:
                    self._surplus_since = now
                elif now - self._surplus_since >= self.scale_down_after:
                    self._workers.pop().terminate()
                    self._surplus_since = now
            else:
                self._surplus_since = None

    def _submit(self) -> JobHandle:
        request = dataclasses.replace(self.template, name=f"{self.template.name}-{next(self._serial)}")
        handle: JobHandle = self.client.submit(request)
        return handle

    def _drop_ended(self) -> None:
        live = []
        for job in self._workers:
            status = job.status()
            if not status.finished:
                live.append(job)
                continue
            self.ended.append(job)
            if status == JobStatus.FAILED:
                self._failures += 1
                backoff = min(_MAX_BACKOFF, 2.0 ** (self._failures - 1))
                self._next_submit = time.monotonic() + backoff
                print(
                    f"[fray] WorkerPool {self.template.name!r}: worker {job.job_id!r} failed "
                    f"({self._failures} in a row); replacing it in {backoff:g}s",
                    file=sys.stderr,
                )
            else:
                self._failures = 0
        self._workers = live

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.reconcile()
            except Exception as exc:  # a transient error (the cluster restarting) must not end the pool
                self.last_error = exc

    def shutdown(self, wait: bool = True) -> None:
        """Stop the pool's thread and terminate every worker (``wait``: until their jobs have ended)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, self.interval * 2))
        with self._lock:
            workers, self._workers = self._workers, []
        errors: list[Exception] = []
        if workers:  # side by side: a terminate may wait for the worker's code to notice (local threads)
            with concurrent.futures.ThreadPoolExecutor(min(len(workers), 16), "fray-pool-stop") as stopper:
                for future in [stopper.submit(job.terminate) for job in workers]:
                    error = future.exception()
                    if isinstance(error, FrayError):
                        errors.append(error)
                    elif error is not None:
                        raise error
        if wait:
            for job in workers:
                try:
                    job.wait(timeout=60, raise_on_failure=False)
                except TimeoutError as exc:
                    errors.append(exc)
        self.ended.extend(workers)
        if errors:
            raise FrayError(f"WorkerPool {self.template.name!r}: {len(errors)} workers did not stop: {errors[0]}")
