"""Plain ``submit`` calls coalesced into ``submit_many`` round trips, behind the caller's back.

A loop of ``client.submit(request)`` paid one controller round trip and one SQLite
transaction per job; ``submit_many`` pays one per few hundred. :class:`SubmitBatcher` gives
the plain loop the batch rate the way group commit does: ``add`` queues the checked spec
and returns at once; one sender thread sends everything queued as one ``submit_many``,
and what arrives while that call is in flight goes in the next one. A lone submit is
sent at once (no timer), so nothing waits for company.

The sender thread is started when there is something to send and ends when the queue is
empty. It is not a daemon: a script that submits and exits still has its jobs recorded
before the interpreter ends, as with a synchronous submit.

A batch is all or none at the controller. When the controller refuses a batch (a parent
job that just finished, say), its jobs are sent again one by one, so only the job the
refusal is about fails; when the call itself failed in transit, the answer is unknown
and every job of the batch gets that error (``submit_many`` is never resent: it is not
idempotent, and a job must not run twice).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from fray.cluster.protocol.messages import JobSpec, JobView
from fray.errors import ActorUnavailableError, FrayError

#: One ``submit_many`` call carries at most this many jobs, or this many bytes of arguments.
BATCH_JOBS = 500
BATCH_BYTES = 32 << 20


def batches(specs: Sequence[JobSpec]) -> list[list[JobSpec]]:
    """``specs`` in order, cut into calls of at most :data:`BATCH_JOBS` jobs and :data:`BATCH_BYTES` bytes."""
    out: list[list[JobSpec]] = [[]]
    size = 0
    for spec in specs:
        weight = len(spec.payload or b"") + 1024
        if out[-1] and (len(out[-1]) >= BATCH_JOBS or size + weight > BATCH_BYTES):
            out.append([])
            size = 0
        out[-1].append(spec)
        size += weight
    return [batch for batch in out if batch]


class SubmitBatcher:
    """Sends queued job specs with ``send`` (one ``submit_many``), in submit order, as fast as it answers.

    ``on_sent(views, detached)`` is called with each answered batch's views, and the
    ``detached`` each was added with, before their futures resolve (the client records the
    jobs it owns there).
    """

    def __init__(
        self,
        send: Callable[[list[JobSpec]], list[JobView]],
        on_sent: Callable[[list[JobView], list[bool]], None],
    ) -> None:
        self._send = send
        self._on_sent = on_sent
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: list[tuple[JobSpec, bool, Future[str]]] = []
        self._sending = False

    def add(self, spec: JobSpec, detached: bool) -> Future[str]:
        """Queue ``spec``; the future resolves to its job id once the controller recorded it."""
        future: Future[str] = Future()
        if self._pid != os.getpid():  # a forked child: its parent's sender thread is not here
            self._reset()
        with self._lock:
            self._queue.append((spec, detached, future))
            if self._sending:
                return future
            self._sending = True
        threading.Thread(target=self._run, name="fray-submit", daemon=False).start()
        return future

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far was sent and answered; False if ``timeout`` passed first."""
        with self._lock:
            return self._idle.wait_for(lambda: not self._sending, timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                queued, self._queue = self._queue, []
                if not queued:
                    self._sending = False
                    self._idle.notify_all()
                    return
            futures = [future for _, _, future in queued]
            try:
                start = 0
                for batch in batches([spec for spec, _, _ in queued]):
                    end = start + len(batch)
                    self._deliver(batch, [detached for _, detached, _ in queued[start:end]], futures[start:end])
                    start = end
            finally:  # a bug of ours must not leave a caller waiting for ever
                for future in futures:
                    if not future.done():
                        future.set_exception(FrayError("the job was not submitted: the submitting thread failed"))

    def _deliver(self, batch: list[JobSpec], detached: list[bool], futures: list[Future[str]]) -> None:
        try:
            views = self._send(batch)
        except ActorUnavailableError as exc:  # lost in transit: recorded or not, nobody knows
            for future in futures:
                future.set_exception(exc)
            return
        except Exception as exc:  # the controller refused the batch: nothing of it was recorded
            if len(batch) == 1:
                futures[0].set_exception(exc)
            else:
                for one in zip(batch, detached, futures, strict=True):
                    self._deliver([one[0]], [one[1]], [one[2]])
            return
        try:
            self._on_sent(views, detached)
        finally:
            for view, future in zip(views, futures, strict=True):
                future.set_result(view.job_id)
