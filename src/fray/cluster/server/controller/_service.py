"""The cluster controller: durable state, scheduling, and the API workers and clients call.

:class:`ControllerService` is a plain object served over the data-only RPC
(:mod:`fray.cluster.rpc.datarpc`; methods and permissions in :mod:`fray.cluster.server.controller._api`).
:class:`Controller` wires it, and the operator API (:mod:`fray.cluster.server.ops`), to one
:class:`~fray.cluster.rpc.datarpc.DataServer` and a :class:`~fray.cluster.server.store.ClusterStore`.

Workers *pull*: a long-poll (:meth:`ControllerService.poll`) returns as soon as
there is something for the worker to do, and reports travel on their own calls,
so a task starts and ends within milliseconds without any periodic tick.

The credentials it issues are kept by :mod:`fray.cluster.server.controller._issuer`; the views and task
environments it builds from its records, by :mod:`fray.cluster.server.controller._job_view`; each worker's
epoch, outbox and unconfirmed kills, by :mod:`fray.cluster.server.controller._worker_sessions`; its
scheduling thread is :mod:`fray.cluster.server.controller._scheduling_loop`.

The package is the controller's layer: besides :class:`ControllerService` it holds its
RPC API and operator API, scheduling loop, worker sessions, pending set, spec cache,
credential issuer, durable queues, utilisation sampling, stall watch and autoscaler host
(retention, which the CLI reads too, is :mod:`fray.cluster.server._retention`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fray.cluster.protocol import _codec as codec
from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.protocol.credentials import ADMIN, Issued, issued_id
from fray.cluster.protocol.messages import (
    CONTROLLER_ACTOR,
    JobSpec,
    JobView,
    StacksAsk,
    TaskAssignment,
    TaskExit,
    WorkerCommands,
    WorkerReport,
)
from fray.cluster.protocol.records import (
    Effects,
    Endpoint,
    JobRecord,
    TaskKey,
    TaskRecord,
    TaskState,
    WorkerRecord,
    WorkerState,
)
from fray.cluster.rpc.registry import EndpointRegistry
from fray.cluster.server.controller._issuer import DEFAULT_JOIN_TTL, CredentialIssuer
from fray.cluster.server.controller._job_view import job_view, tpu_device_env
from fray.cluster.server.controller._pending import PendingSet
from fray.cluster.server.controller._preemption import preemption_after
from fray.cluster.server.controller._queues import QueueService
from fray.cluster.server.controller._scheduling_loop import LEASE_FRACTION, SchedulingLoop
from fray.cluster.server.controller._specs import DEFAULT_MAX_SPECS, CachedSpec, SpecCache
from fray.cluster.server.controller._stacks_relay import StacksRelay
from fray.cluster.server.controller._worker_sessions import WorkerSessions
from fray.cluster.server.scheduler import (
    PendingJob,
    PendingQueue,
    RunningTask,
    SchedulingDecision,
    schedule_queue,
)
from fray.cluster.server.store import ClusterStore
from fray.cluster.server.store._database import ReadOnlyMode
from fray.errors import AuthenticationError, FrayError, JobAlreadyExists, NotFound, PermissionDenied, StorageError
from fray.job import JobStatus
from fray.stacks import ProcessStacks

__all__ = ["CONTROLLER_ACTOR", "DEFAULT_JOIN_TTL", "ControllerService"]

logger = logging.getLogger(__name__)

# Calls that may block (worker long-polls, client waits) each hold a server thread.
_MAX_CONCURRENCY = 512
# How long wait_status holds a partial answer to gather more completions (see there).
_WAIT_LINGER = 0.05
# ... and longer for a long list, up to _WAIT_LINGER_MAX: each answer costs a pass over the whole list (and the
# client's next call another), so a wait_all over a deep queue would otherwise cost more per job the deeper it is.
_WAIT_LINGER_PER_JOB = 0.0002
_WAIT_LINGER_MAX = 0.5
# Past this many lent tasks, those of finished jobs are forgotten.
_LENT_PRUNE = 1024
_FINISHED_STATES = frozenset(state.value for state in JobStatus if state.finished)


class ControllerService:
    """Everything the controller does, as methods: served over the data-only RPC by :class:`Controller`.

    ``spec_cache_size`` bounds how many decoded job specs stay in memory (least recently
    used go first; default 1,024); a job whose spec was dropped is read back from the store.
    ``master`` is the cluster token, from which every credential is derived (see
    :mod:`fray.cluster.protocol.credentials`); ``pin`` is the pin of the cluster CA when the controller
    serves TLS, written into the credentials it issues (join tokens, workers', users', jobs').
    """

    def __init__(
        self,
        store: ClusterStore,
        *,
        worker_timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        spec_cache_size: int = DEFAULT_MAX_SPECS,
        master: bytes | None = None,
        pin: str = "",
    ) -> None:
        self._store = store
        self.pin = pin
        # Join tokens, workers' and users' own credentials, and the keys every credential derives from.
        self._issuer = CredentialIssuer(store, master, self._job_is_live, clock, pin)
        self._keys = self._issuer.keys
        self._worker_timeout = worker_timeout
        self._clock = clock
        self._lock = threading.Lock()
        # Notified whenever a job or endpoint changes, for clients' long-polls.
        self._changed = threading.Condition(self._lock)
        self._generation = 0  # counts notifications of _changed, so waiters miss none
        # Each worker's epoch, outbox and unconfirmed kills, guarded by _lock too.
        self._sessions = WorkerSessions(store, self._lock, worker_timeout)
        self._specs = SpecCache(
            lambda job_id: (store.job_request(job_id), store.get_job(job_id).namespace), spec_cache_size
        )
        self._kick = threading.Event()
        # Tasks blocked on their own work that lent their CPU (fray.core._lending): the scheduler
        # counts no CPU for them. Kept in memory only: after a restart they count again until
        # they lend anew, which can only make the controller more careful.
        self._lent: set[TaskKey] = set()
        # Held by a pass from recording its placements until they are in the outboxes, and by a
        # registration from reading its worker's assigned tasks until it has emptied its outbox: a
        # placement is then either in what the registration reads (and its start, if queued
        # already, is dropped with the outbox) or queued after it (and the next poll takes it);
        # never lost between the two, never sent twice.
        self._placing = threading.Lock()
        self._stopping = threading.Event()
        # Held by a revocation from revoking in the store until the issuer has reloaded, and by a
        # registration from checking its caller's credential until it is recorded: a registration
        # whose credential check passed just before a revocation cannot make the revoked worker ALIVE.
        self._membership = threading.Lock()
        # Endpoints of servers that are not Fray tasks (registered through the registry API).
        self._external = EndpointRegistry()
        # Whether the store can be written: when it cannot, the controller serves reads only.
        self._storage = ReadOnlyMode(store.path)
        # The queue in memory (SQLite stays the record): see fray.cluster.server.controller._pending.
        self._queue = PendingSet(store)
        # Live stacks (issue 35): asks reach workers through their outboxes; answers wait here, lock-free.
        self._stacks = StacksRelay(store, self._send_stacks)
        self._loop = SchedulingLoop(
            store,
            self._storage,
            worker_timeout=worker_timeout,
            clock=clock,
            kick=self._kick,
            stopping=self._stopping,
            apply=self._apply,
            schedule=self.schedule_once,
            storage_failed=self.storage_failed,
        )

    # ----- queues (kept by fray.cluster.server.controller._queues; the Controller sets ``queues``) -------------------

    queues: QueueService | None = None

    def queue_stats(self) -> list[dict[str, Any]]:
        """Every queue with its backlog (the operator API's status and the dashboard read this)."""
        return self.queues.stats() if self.queues is not None else []

    def _notify_changed(self) -> None:
        """Wake long-polls waiting for a job or endpoint to change (call with ``_lock`` held)."""
        self._generation += 1
        self._changed.notify_all()

    def _wait_for_change(self, since: int, timeout: float) -> None:
        """Wait until something changed after generation ``since`` (or ``timeout``); lock not held."""
        with self._lock:
            if self._generation == since and not self._stopping.is_set():
                self._changed.wait(timeout)

    # ----- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduling loop (after a restart, workers get a full timeout to reconnect)."""
        self._queue.load()
        self._store.refresh_heartbeats(self._clock())
        self._loop.start()

    def stop(self) -> None:
        """Stop the scheduling loop and wake every waiter."""
        self._stopping.set()
        self._kick.set()
        with self._lock:
            self._notify_changed()
            self._sessions.wake()
        self._loop.join()

    # ----- storage failures ---------------------------------------------------------------------

    def storage_failed(self, error: StorageError) -> None:
        """The store could not be written: serve reads only until a write succeeds again."""
        if self._storage.failed(error):
            logger.error("the controller is READ-ONLY until its storage can be written again: %s", error)

    def health(self) -> dict[str, object]:
        """Plain data for ``fray status``: read-only or not and why, the state file and its free space."""
        return self._storage.health()

    # Set by fray.cluster.server.controller._autoscale_host when the cluster has a VM provider: workers given no new
    # tasks (VMs booting or draining), and the autoscaler's word on each pending job's reason.
    fenced_workers: frozenset[str] = frozenset()
    # Called with the ids of join tokens just revoked (the autoscaler's host replaces the one its VMs join with).
    tokens_revoked: Callable[[set[str]], None] | None = None
    pending_notes: Callable[[SchedulingDecision], SchedulingDecision] | None = None

    def pending_snapshot(self) -> tuple[PendingJob, ...]:
        """The pending jobs in submission order, from memory (the autoscaler's dry run reads them)."""
        return self._queue.snapshot()

    def lose_worker(self, worker_id: str, reason: str) -> None:
        """Declare ``worker_id`` lost now (its VM was preempted): its tasks are retried within the preemption budget."""
        self._apply(self._store.lose_worker(worker_id, self._clock(), reason))

    def stop_worker(self, worker_id: str, reason: str, exited: list[TaskExit] | None = None) -> WorkerRecord:
        """``worker_id`` leaves on purpose (it drained, or its VM was scaled down): STOPPED, not lost.

        ``exited`` (a draining worker's last exits, its handed-back tasks among them) are recorded
        first, as a report's; whatever is still assigned or running there is lost (retried under
        the preemption budget). Its epoch ends. NotFound if it never registered.
        """
        exits = list(exited or ())
        with self._membership:
            effects = self._store.stop_worker(
                worker_id, self._clock(), reason, [(e.key, e.exit_code, e.failure) for e in exits]
            )
        with self._lock:
            self._sessions.end_epoch(worker_id)
            if exits:
                self._sessions.confirmed(e.key for e in exits)
                self._notify_changed()
        self._apply(effects)  # an alive worker is lost on its way: its outbox and unconfirmed kills are dropped
        logger.info("worker %s stopped: %s", worker_id, reason)
        return self._store.get_worker(worker_id)

    def schedule_once(self, now: float | None = None) -> list[TaskRecord]:
        """Run one scheduling pass over the in-memory pending set and send the assigned tasks to their workers."""
        now = self._clock() if now is None else now
        # The queue as kept sorted and counted by shape: the pass stops once nothing left can change,
        # so its cost does not grow with the backlog (see fray.cluster.server.scheduler.schedule_queue).
        pending = self._queue.view()
        if not pending.jobs:
            return []
        with self._lock:
            lent = frozenset(self._lent)
        snapshot = self._store.scheduler_input(pending=False, lent=lent)
        workers = snapshot.workers
        fenced = self.fenced_workers
        if fenced:
            workers = tuple(w for w in workers if w.worker_id not in fenced)
        decision = schedule_queue(pending, workers, snapshot.running, snapshot.credits, now=now)
        if self.pending_notes is not None:
            decision = self.pending_notes(decision)
        with self._placing:
            assigned = self._queue.record(decision, lambda changed: self._store.apply_decision(decision, now, changed))
            if assigned:
                assignments = [self._assignment(task) for task in assigned]
                with self._lock:
                    self._sessions.send_starts(assigned, assignments)
                    self._notify_changed()
        self._preempt_for_better_band(pending, decision, workers, snapshot.running, now)
        return assigned

    def _preempt_for_better_band(
        self,
        pending: PendingQueue,
        decision: SchedulingDecision,
        workers: tuple[WorkerInfo, ...],
        running: tuple[RunningTask, ...],
        now: float,
    ) -> None:
        """Preempt worse-band gangs so that an unplaced better-band job fits (see ``_preemption``)."""
        chosen = preemption_after(pending, decision, workers, running, now)
        if chosen is None:
            return
        logger.info("preempting %s for job %s (band %d)", ", ".join(chosen.victims), chosen.job_id, chosen.band)
        # The victims are pending again in their worse band: the next pass (kicked by the retry)
        # places the better job first, on the room they left.
        self._apply(self._store.preempt_gangs(chosen.victims, chosen.reason, now))

    def job_spec(self, job_id: str) -> JobSpec:
        """The job's spec (decoded from plain data; cached), without its payload: the controller never opens one."""
        return self._specs.get(job_id).spec

    def _assignment(self, task: TaskRecord) -> TaskAssignment:
        cached = self._specs.get(task.job_id)
        spec = cached.spec
        # Only a TPU task reads its job back (for its slice's coordinator): the rest is in the cache.
        device_env = tpu_device_env(self._store, self._store.get_job(task.job_id), task) if spec.resources.tpu else {}
        return TaskAssignment(
            key=task.key,
            job_name=spec.name,
            namespace=cached.namespace,
            replica_index=task.replica_index,
            replica_count=spec.replicas,
            host_index=task.host_index,
            spec=spec,
            encoded_spec=cached.encoded,
            credential=self._keys.job_credential(task.job_id, self.pin),
            actor_token=self.namespace_token(cached.namespace),
            device_env=device_env,
        )

    # ----- credentials --------------------------------------------------------------------------

    def key_for(self, principal: str) -> bytes | None:
        """The key a connection claiming ``principal`` must prove (None: refused); see :mod:`.credentials`."""
        return self._keys.key_for(principal)

    def namespace_token(self, namespace: str) -> str:
        """The key actor servers and clients of ``namespace`` authenticate with (hex; "" without a master)."""
        return self._keys.namespace_token(namespace)

    def principal_valid(self, principal: str) -> bool:
        """False once an issued credential was revoked or has expired (checked on every call, not only at connect)."""
        return self._keys.valid(principal)

    def credential_state(self, principal: str) -> str:
        """``valid``, ``revoked``, ``expired`` or ``unknown``: what a refused call says."""
        return self._keys.state(principal)

    def create_token(self, role: str, ttl: float | None = None) -> tuple[Issued, str]:
        """Issue a join token (``role="worker"``) or a user credential (``role="user:NAME"``); its record and line.

        See :meth:`CredentialIssuer.create_token <fray.cluster.server.controller._issuer.CredentialIssuer.create_token>`.
        """
        return self._issuer.create_token(role, ttl)

    def join(self, token_principal: str, worker_id: str) -> str:
        """Exchange the join token the caller proved for ``worker_id``'s own credential (its line).

        A worker that was revoked joins again only with a token made after its revocation.
        """
        return self._issuer.join(token_principal, worker_id)

    def list_credentials(self) -> list[Issued]:
        """Every issued credential and join token (none of their keys)."""
        return self._issuer.list()

    def revoke_credential(self, credential_id: str) -> bool:
        """Revoke one issued credential or join token: it stops working at once (False: it was already)."""
        revoked = self._issuer.revoke(credential_id)
        if revoked and self.tokens_revoked is not None:
            self.tokens_revoked({credential_id})
        return revoked

    def revoke_worker(self, worker_id: str) -> WorkerRecord:
        """Revoke ``worker_id``'s credentials at once; it is lost (its tasks get new attempts) and REVOKED.

        The join tokens it joined with are revoked too: whoever holds the worker's machine holds
        them, and must not join again under a new id.
        """
        with self._membership:
            before = {r.credential_id for r in self._issuer.list() if r.revoked_at is not None}
            effects = self._store.revoke_worker(worker_id, self._clock())
            self._issuer.reload()
            tokens = {
                r.credential_id
                for r in self._issuer.list()
                if r.subject == "join" and r.revoked_at is not None and r.credential_id not in before
            }
        with self._lock:
            self._sessions.end_epoch(worker_id)
        self._apply(effects)
        logger.warning(
            "worker %s was revoked%s", worker_id, f" with its join tokens {sorted(tokens)}" if tokens else ""
        )
        if tokens and self.tokens_revoked is not None:
            self.tokens_revoked(tokens)
        return self._store.get_worker(worker_id)

    def _check_may_register(self, principal: str, worker_id: str) -> None:
        if not self._keys.valid(principal):
            raise AuthenticationError(f"the credential {principal!r} was revoked or has expired")
        # The shared worker credential cannot be revoked, so a revoked worker id stays refused to it;
        # an issued credential made after the revocation (a new join) is valid and brings it back.
        if issued_id(principal) is None and principal != ADMIN and self.worker_revoked(worker_id):
            raise PermissionDenied(
                f"worker {worker_id!r} was revoked: it joins again only with a new join token "
                "(fray token create --role worker; fray worker --join TOKEN)"
            )

    def worker_revoked(self, worker_id: str) -> bool:
        """Whether ``worker_id`` is REVOKED (only a credential issued since brings it back)."""
        try:
            return self._store.get_worker(worker_id).state == WorkerState.REVOKED
        except NotFound:
            return False

    def namespace_owner(self, namespace: str) -> str | None:
        """The user whose jobs the namespace holds (None: nobody's yet)."""
        return self._store.namespace_owner(namespace)

    def _job_is_live(self, job_id: str) -> bool:
        try:
            return not self._store.get_job(job_id).state.finished
        except NotFound:
            return False

    def _apply(self, effects: Effects) -> None:
        """Act on what a state change caused: send kills, wake waiters and the scheduler."""
        if not effects.applied:
            return
        self._queue.track(effects)
        with self._lock:
            self._sessions.apply(effects)
            if effects.finished or effects.retried or effects.kill:
                self._notify_changed()
        if effects.finished or effects.retried or effects.lost_workers or effects.kill:
            self._kick.set()

    # ----- workers ------------------------------------------------------------------------------

    def register_worker(
        self,
        info: WorkerInfo,
        address: str,
        running: list[TaskKey],
        exited: list[TaskExit] | None = None,
        *,
        principal: str | None = None,
    ) -> WorkerCommands:
        """A worker (re)joins with the tasks it runs and the exits not yet acknowledged; returns its orders.

        The answer carries the worker's new epoch (its older reports are refused from now
        on) and its lease; the exits are recorded exactly as reports would be. ``principal``
        is the caller's: checked again here, atomically with revocations, so that a worker
        revoked while its registration was on the way stays REVOKED.
        """
        exits = list(exited or ())
        with self._membership:
            if principal is not None:
                self._check_may_register(principal, info.worker_id)
            now = self._clock()
            effects = self._store.register_worker(
                info, address, now, running, [(e.key, e.exit_code, e.failure) for e in exits]
            )
        epoch = self._store.worker_epoch(info.worker_id)
        with self._lock:
            self._sessions.registered(info.worker_id, epoch, now)
        self._apply(effects)
        reported = set(running) | {e.key for e in exits}
        with self._placing:
            # Assignments made before a controller restart (or lost with a broken poll) are resent.
            start = [
                self._assignment(task)
                for task in self._store.tasks_on_worker(info.worker_id)
                if task.state == TaskState.ASSIGNED and task.key not in reported
            ]
            with self._lock:
                outbox = self._sessions.take(info.worker_id)
                self._sessions.confirmed(e.key for e in exits)
                if exits:
                    self._notify_changed()
        kill = [o.task for o in effects.kill if o.worker_id == info.worker_id] + outbox.kill
        self._kick.set()
        return WorkerCommands(
            start=tuple(start),
            kill=tuple(dict.fromkeys(kill)),
            epoch=epoch,
            lease_seconds=self._worker_timeout * LEASE_FRACTION,
            stacks=tuple(outbox.stacks),
        )

    def poll(self, worker_id: str, epoch: int, wait: float = 1.0) -> WorkerCommands:
        """Long-poll: return the worker's next commands as soon as there are any (or after ``wait`` s).

        A worker whose ``epoch`` has ended (it was declared lost, or registered again) is
        told to register again.
        """
        if not self._sessions.heartbeat(worker_id, epoch, self._clock()):
            return WorkerCommands(reregister=True)
        deadline = time.monotonic() + min(max(wait, 0.0), 30.0)
        with self._lock:
            return self._sessions.next_commands(worker_id, deadline, self._stopping)

    def report(self, worker_id: str, epoch: int, report: WorkerReport) -> bool:
        """Apply a worker's report in one transaction; False (nothing applied) tells it to register again.

        A report of an epoch that has ended is refused whole: that is what fences a worker
        the controller gave up on. Exits are idempotent by task attempt: one already
        recorded is simply acknowledged again.
        """
        now = self._clock()
        effects: list[Effects] = []
        # Checked before the batch (never take the controller's lock while holding the store's). A
        # worker declared lost between the check and the batch is still fenced: its tasks are LOST
        # by then, and reports about them are stale.
        if not self._sessions.heartbeat(worker_id, epoch, now):
            return False
        with self._store.batch():
            if self._store.set_worker_health(worker_id, report.health):
                if report.health:
                    logger.warning("worker %s is unhealthy, it gets no new tasks: %s", worker_id, report.health)
                else:
                    logger.info("worker %s recovered", worker_id)
                self._kick.set()
            for key in report.started:
                self._store.mark_task_running(key, now, worker_id)
            for key, lines in report.logs:
                with contextlib.suppress(NotFound):
                    self._store.append_logs(key, lines)
            for exit_ in report.exited:
                effects.append(self._store.mark_task_exited(exit_.key, exit_.exit_code, now, exit_.failure, worker_id))
        for effect in effects:
            self._apply(effect)
        if report.exited:
            with self._lock:
                self._sessions.confirmed(e.key for e in report.exited)
                self._notify_changed()
        if report.started:
            with self._lock:
                self._notify_changed()
        return True

    # ----- clients: jobs ------------------------------------------------------------------------

    def submit(
        self, spec: JobSpec, *, user: str, parent_id: str | None = None, namespace: str | None = None
    ) -> JobView:
        """Record a new job; it is scheduled at once if it fits."""
        return self.submit_many([spec], user=user, parent_id=parent_id, namespace=namespace)[0]

    def submit_many(
        self,
        specs: list[JobSpec],
        *,
        user: str,
        parent_id: str | None = None,
        namespace: str | None = None,
        encoded: list[bytes] | None = None,
    ) -> list[JobView]:
        """Record new jobs in one transaction (all or none); they are scheduled at once if they fit.

        ``encoded`` are the specs as their client encoded them (:func:`~fray.cluster.protocol._codec.encode_spec`):
        stored and forwarded to workers as they are. Without them (a caller in this process) they are made here.
        """
        for spec in specs:
            if not isinstance(spec, JobSpec):
                raise FrayError(f"submit() takes a JobSpec, got {type(spec).__name__}")
        forms = encoded if encoded is not None else [codec.encode_spec(spec) for spec in specs]
        if len(forms) != len(specs):
            raise FrayError(f"{len(specs)} specs but {len(forms)} encoded forms")
        now = self._clock()
        if parent_id is not None:
            try:
                parent = self._store.get_job(parent_id)
            except NotFound:
                raise FrayError(f"parent job {parent_id!r} is not known to this controller") from None
            namespace = namespace or parent.namespace
        with self._lock:  # makes the unique-actor-name check and the insert one step
            actors = [spec.actor_name for spec in specs if spec.actor_name]
            for name in actors:
                holder = self._store.live_job_with_label(namespace, name) if namespace is not None else None
                if holder is not None or actors.count(name) > 1:
                    raise JobAlreadyExists(
                        name,
                        reason=f"an actor of this name is already live in namespace {namespace!r} "
                        f"(job {holder or 'in this same batch'!r}); terminate it first or pick another name",
                    )
            records = self._store.submit_many(
                list(zip(specs, forms, strict=True)),
                user=user,
                now=now,
                parent_id=parent_id,
                namespace=namespace,
                labels=[spec.actor_name for spec in specs],
            )
        for record, spec, form in zip(records, specs, forms, strict=True):
            self._specs.remember(record.job_id, CachedSpec.of(spec, form, record.namespace))
        self._queue.add(records)
        self._kick.set()
        return [self._view(record) for record in records]

    def _view(self, job: JobRecord) -> JobView:
        failure = self._store.job_failure(job.job_id) if job.state == JobStatus.FAILED else None
        with self._lock:
            settled = self._sessions.settled(job.job_id)
        waiting = self._queue.waiting_by_band() if job.state == JobStatus.PENDING and job.band > 1 else None
        return job_view(job, failure, settled, waiting)

    def job(self, job_id: str) -> JobView:
        """The job's current state; raises NotFound."""
        return self._view(self._store.get_job(job_id))

    def wait(self, job_ids: list[str], timeout: float = 10.0, *, any_finished: bool = True) -> list[JobView]:
        """Block until one (``any_finished``) or all of ``job_ids`` are finished and settled, or ``timeout``."""
        deadline = time.monotonic() + min(max(timeout, 0.0), 60.0)
        while True:
            since = self._generation
            views = [self.job(job_id) for job_id in job_ids]
            done = [v.state.finished and v.settled for v in views]
            if (any(done) if any_finished else all(done)) or not views:
                return views
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping.is_set():
                return views
            self._wait_for_change(since, remaining)

    def wait_status(
        self, job_ids: list[str], timeout: float = 10.0, linger: float = _WAIT_LINGER
    ) -> list[tuple[str, bool]]:
        """``(state, settled)`` of each job, once any is finished and settled (or ``timeout``): what ``wait_all`` needs.

        Cheaper than :meth:`wait` for many jobs: one query for all states, no views. When
        some but not all jobs are done (and none failed), it lingers ``linger`` seconds so
        that the completions of a busy cluster come back in batches, not one call each.
        """
        deadline = time.monotonic() + min(max(timeout, 0.0), 60.0)
        linger = max(linger, min(_WAIT_LINGER_MAX, len(job_ids) * _WAIT_LINGER_PER_JOB))
        lingered = False
        while True:
            since = self._generation
            states = self._queue.unfinished_states(job_ids)
            # Only jobs that finished (or are unknown) need the store.
            ended = [job_id for job_id in job_ids if job_id not in states]
            remaining = deadline - time.monotonic()
            if not ended and remaining > 0 and not self._stopping.is_set():
                self._wait_for_change(since, remaining)  # none finished: nothing more to look at
                continue
            states.update(self._store.job_states(ended))
            missing = [job_id for job_id in ended if job_id not in states]
            if missing:
                raise NotFound(f"no job {missing[0]!r}")
            with self._lock:
                unsettled = self._sessions.unsettled_jobs()
            result = [(states[job_id], job_id not in unsettled) for job_id in job_ids]
            done = [state in _FINISHED_STATES and settled for state, settled in result]
            if all(done) or remaining <= 0 or self._stopping.is_set():
                return result
            if any(done):
                if lingered or len(job_ids) == 1 or any(state == JobStatus.FAILED for state, _ in result):
                    return result
                lingered = True
                self._stopping.wait(min(linger, remaining))
                continue
            self._wait_for_change(since, remaining)

    def terminate(self, job_id: str, reason: str = "terminated") -> JobView:
        """Stop the job, its tasks and its descendants."""
        self._apply(self._store.terminate_job(job_id, self._clock(), reason))
        return self.job(job_id)

    def lend_cpu(self, key: TaskKey, lent: bool) -> bool:
        """Task ``key`` is blocked on its own work (``lent``) or resumed: its CPU is free for others, or not.

        Lending kicks a pass (the work it waits for may start now); taking it back needs none:
        the task may briefly use more than its worker has, which the next pass sees. False for a
        task that is not running (nothing to lend).
        """
        if lent and self._store.get_task(key).state.value not in ("assigned", "running"):
            return False
        with self._lock:
            if lent:
                self._lent.add(key)
                if len(self._lent) > _LENT_PRUNE:  # tasks killed while lent never took it back
                    running = self._queue.unfinished_states({k.job_id for k in self._lent})
                    self._lent = {k for k in self._lent if running.get(k.job_id) == JobStatus.RUNNING.value}
            else:
                self._lent.discard(key)
        if lent:
            self._kick.set()
        return True

    def preempt(self, job_id: str, replica: int | None = None) -> JobView:
        """Lose the running ``replica`` of the job (all of it if None) as a preemption (``fray.testing.preempt``)."""
        self._apply(self._store.preempt(job_id, replica, self._clock()))
        return self.job(job_id)

    def logs(self, job_id: str, last: int | None = None, after_id: int = 0) -> list[tuple[int, str]]:
        """The job's output lines as ``(line_id, text)``; ``after_id`` to follow new output."""
        return [(line.line_id, line.line) for line in self._store.read_logs(job_id, after_id=after_id, last=last)]

    def job_stacks(self, job_id: str, timeout: float = 10.0, locals: bool = False) -> list[ProcessStacks]:
        """The live stacks of the job's running tasks and its running descendants' (waits without the lock)."""
        self._store.get_job(job_id)  # NotFound for an unknown job
        return self._stacks.job_stacks(job_id, timeout, locals)

    def stacks_answer(self, worker_id: str, epoch: int, request_id: int, stacks: list[Any]) -> bool:
        """A worker's answer to a stacks request; False if it came too late or from an ended epoch."""
        if not self._sessions.heartbeat(worker_id, epoch, self._clock()):
            return False
        return self._stacks.answer(worker_id, request_id, stacks)

    def _send_stacks(self, asks: dict[str, StacksAsk]) -> list[str]:
        with self._lock:
            return self._sessions.send_stacks(asks)

    def list_jobs(self, states: list[str] | None = None) -> list[JobView]:
        """All jobs (optionally only those in ``states``), oldest first."""
        wanted = None if states is None else [JobStatus(s) for s in states]
        return [self._view(job) for job in self._store.list_jobs(states=wanted)]

    def tasks(self, job_id: str) -> list[TaskRecord]:
        """The tasks of the job's current attempt, with pending reasons."""
        return self._store.get_tasks(job_id)

    def list_workers(self) -> list[WorkerRecord]:
        """Every worker the controller knows, alive or lost."""
        return self._store.list_workers()

    # ----- endpoints ----------------------------------------------------------------------------

    def register_endpoint(self, namespace: str, name: str, url: str, task: TaskKey) -> bool:
        """A running task serves ``name`` at ``url``; it disappears when the task ends."""
        ok = self._store.register_endpoint(namespace, name, url, task, self._clock())
        with self._lock:
            self._notify_changed()
        return ok

    def list_endpoints(self, namespace: str | None = None) -> list[Endpoint]:
        """Endpoints of ``namespace`` (every namespace if None)."""
        if namespace is not None:
            return self._store.list_endpoints(namespace)
        namespaces = {job.namespace for job in self._store.list_jobs(states=[JobStatus.RUNNING])}
        return [e for ns in sorted(namespaces) for e in self._store.list_endpoints(ns)]

    def wait_actor(self, namespace: str, name: str, job_id: str, timeout: float = 10.0) -> tuple[str, str, JobView]:
        """Wait until actor ``name`` (hosted by ``job_id``) is served or its job ended.

        Returns ``("ready", url, view)``, ``("dead", reason, view)`` or ``("pending", reason, view)``
        when ``timeout`` passed first.
        """
        deadline = time.monotonic() + min(max(timeout, 0.0), 60.0)
        while True:
            since = self._generation
            view = self.job(job_id)
            if view.state.finished:
                return "dead", view.error or view.state.value, view
            for endpoint in self._store.list_endpoints(namespace, prefix=name):
                if endpoint.name == name and endpoint.task.job_id == job_id:
                    return "ready", endpoint.address, view
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping.is_set():
                return "pending", view.pending_reason or view.state.value, view
            self._wait_for_change(since, remaining)

    # The endpoint-registry API, so that a plain ClusterResolver can find task-hosted actors too.

    def resolve(self, namespace: str, name: str) -> list[str]:
        """URLs serving ``name`` in ``namespace`` (task endpoints first, then external servers)."""
        urls = [e.address for e in self._store.list_endpoints(namespace, prefix=name) if e.name == name]
        return urls or self._external.resolve(namespace, name)

    def register(self, namespace: str, name: str, url: str) -> None:
        """Register a server that is not a Fray task (it is forgotten when the controller restarts)."""
        self._external.register(namespace, name, url)

    def unregister(self, namespace: str, name: str, url: str) -> None:
        """Forget an external server's endpoint."""
        self._external.unregister(namespace, name, url)

    def list(self, namespace: str) -> dict[str, str]:
        """``name -> url`` of every endpoint in ``namespace``."""
        found = self._external.list(namespace)
        found.update({e.name: e.address for e in self._store.list_endpoints(namespace)})
        return found
