"""The controller's side of each worker's session: its epoch, its outbox, and the kills it has not confirmed.

:class:`~fray.cluster.server.controller.ControllerService` keeps one :class:`WorkerSessions`.
Workers *pull*: what the controller wants of a worker waits in its outbox until the
worker's next poll (or registration) takes it. A kill order stays unconfirmed until the
worker reports the task's exit; a job with an unconfirmed kill is not settled, since its
processes may still run.

Every method is called with the controller's lock held (the one given to
:class:`WorkerSessions`), except :meth:`WorkerSessions.heartbeat`, which takes it itself:
the store is written without it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from fray.cluster.protocol.messages import StacksAsk, TaskAssignment, WorkerCommands
from fray.cluster.protocol.records import Effects, TaskKey, TaskRecord
from fray.cluster.server.store import ClusterStore

__all__ = ["HEARTBEAT_WRITE_SECONDS", "Outbox", "WorkerSessions"]

#: A worker's heartbeat is written to the store at most this often (its epoch is checked in memory)...
HEARTBEAT_WRITE_SECONDS = 0.5
#: ... and at most this fraction of the worker timeout, since the stored heartbeat (what expiry reads)
#: lags the worker's last contact by up to that much: a short timeout must not lose half a second of it.
HEARTBEAT_WRITE_FRACTION = 1 / 40


@dataclass
class Outbox:
    """Commands waiting for one worker's next poll."""

    start: list[TaskAssignment] = field(default_factory=list)
    kill: list[TaskKey] = field(default_factory=list)
    stacks: list[StacksAsk] = field(default_factory=list)


class WorkerSessions:
    """Each alive worker's epoch and outbox, and every kill order no worker has confirmed yet."""

    def __init__(self, store: ClusterStore, lock: threading.Lock, worker_timeout: float = 10.0) -> None:
        self._store = store
        # The stored heartbeat lags the last contact by at most this: a worker is declared lost no
        # earlier than ``worker_timeout - write_every`` after its last contact.
        self._write_every = min(HEARTBEAT_WRITE_SECONDS, worker_timeout * HEARTBEAT_WRITE_FRACTION)
        self._lock = lock
        self._outboxes: dict[str, Outbox] = {}
        self._ready = threading.Condition(lock)
        # Kill orders sent but not yet confirmed by the worker: a terminated job is not
        # "settled" (its processes may still run) until they are.
        self._unconfirmed_kills: dict[TaskKey, str] = {}
        # Each alive worker's current epoch and when its heartbeat was last written (see heartbeat).
        self._epochs: dict[str, int] = {}
        self._heartbeat_written: dict[str, float] = {}

    # ----- epochs -------------------------------------------------------------------------------

    def heartbeat(self, worker_id: str, epoch: int, now: float) -> bool:
        """True if ``epoch`` is the worker's current one (it is alive); records the heartbeat.

        Checked in memory; the store's heartbeat (a write) happens at most every
        :data:`HEARTBEAT_WRITE_SECONDS` (and 1/40 of the worker timeout) per worker, which is all that
        expiring lost workers needs.
        Called without the lock.
        """
        with self._lock:
            current = self._epochs.get(worker_id)
            written = self._heartbeat_written.get(worker_id, 0.0)
        if current is not None and current != epoch:
            return False
        if current is not None and now - written < self._write_every:
            return True
        alive = self._store.heartbeat(worker_id, now, epoch)
        with self._lock:
            if alive:
                self._epochs[worker_id] = epoch
                self._heartbeat_written[worker_id] = now
            elif self._epochs.get(worker_id) == epoch:
                del self._epochs[worker_id]
        return alive

    def registered(self, worker_id: str, epoch: int, now: float) -> None:
        """``worker_id`` registered ``now``, starting ``epoch``: its older polls and reports are refused."""
        self._epochs[worker_id] = epoch
        self._heartbeat_written[worker_id] = now

    def end_epoch(self, worker_id: str) -> None:
        """Refuse ``worker_id``'s polls and reports from now on, until it registers again (a poll waiting now too)."""
        self._epochs.pop(worker_id, None)
        self._ready.notify_all()

    # ----- outboxes -----------------------------------------------------------------------------

    def send_starts(self, tasks: Sequence[TaskRecord], assignments: Sequence[TaskAssignment]) -> None:
        """Queue each newly assigned task's assignment for its worker, and wake the workers' polls."""
        for task, assignment in zip(tasks, assignments, strict=True):
            assert task.worker_id is not None
            self._outboxes.setdefault(task.worker_id, Outbox()).start.append(assignment)
        self._ready.notify_all()

    def send_stacks(self, asks: dict[str, StacksAsk]) -> list[str]:
        """Queue a stacks request for each alive worker of ``asks`` and wake their polls; the workers not alive."""
        gone = [worker_id for worker_id in asks if worker_id not in self._epochs]
        for worker_id, ask in asks.items():
            if worker_id not in gone:
                self._outboxes.setdefault(worker_id, Outbox()).stacks.append(ask)
        self._ready.notify_all()
        return gone

    def take(self, worker_id: str) -> Outbox:
        """Everything waiting for ``worker_id`` (a registering worker gets it with its answer)."""
        return self._outboxes.pop(worker_id, Outbox())

    def next_commands(self, worker_id: str, deadline: float, stopping: threading.Event) -> WorkerCommands:
        """Wait (releasing the lock) until ``worker_id`` has commands, ``deadline`` (monotonic) or ``stopping``."""
        while True:
            outbox = self._outboxes.get(worker_id)
            if outbox is not None and (outbox.start or outbox.kill or outbox.stacks):
                del self._outboxes[worker_id]
                return WorkerCommands(start=tuple(outbox.start), kill=tuple(outbox.kill), stacks=tuple(outbox.stacks))
            if worker_id not in self._epochs:  # its epoch ended meanwhile (it left, or was lost or revoked)
                return WorkerCommands(reregister=True)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or stopping.is_set():
                return WorkerCommands()
            self._ready.wait(remaining)

    def wake(self) -> None:
        """Wake every waiting poll (the controller is stopping)."""
        self._ready.notify_all()

    # ----- kills --------------------------------------------------------------------------------

    def apply(self, effects: Effects) -> None:
        """Send ``effects``' kill orders, and forget its lost workers."""
        for order in effects.kill:
            outbox = self._outboxes.setdefault(order.worker_id, Outbox())
            unsent = [a for a in outbox.start if a.key == order.task]
            if unsent:  # the worker never heard of it: withdraw the start instead of killing
                outbox.start.remove(unsent[0])
                continue
            outbox.kill.append(order.task)
            self._unconfirmed_kills[order.task] = order.worker_id
        for worker_id in effects.lost_workers:
            # Nothing can be confirmed by a worker that is gone, and its epoch is over.
            self._epochs.pop(worker_id, None)
            self._outboxes.pop(worker_id, None)
            for key in [k for k, w in self._unconfirmed_kills.items() if w == worker_id]:
                del self._unconfirmed_kills[key]
        if effects.kill:
            self._ready.notify_all()

    def confirmed(self, keys: Iterable[TaskKey]) -> None:
        """The worker reported these tasks' exits: their kills (if any) are done."""
        for key in keys:
            self._unconfirmed_kills.pop(key, None)

    def settled(self, job_id: str) -> bool:
        """Whether no kill of ``job_id``'s tasks awaits its worker's confirmation."""
        return not any(key.job_id == job_id for key in self._unconfirmed_kills)

    def unsettled_jobs(self) -> set[str]:
        """The jobs with a kill that awaits its worker's confirmation."""
        return {key.job_id for key in self._unconfirmed_kills}
