"""The autoscaler: turns demand the cluster cannot place into slices of VMs, and idle VMs back into nothing.

One :meth:`Autoscaler.tick` reads what the controller knows (:class:`ClusterView`: pending
jobs, workers, running tasks) and what the provider lists, and acts:

1. **Reconcile** with the provider's listing, which is the truth: VMs of this cluster that
   the autoscaler does not know are adopted (after a controller restart), VMs it knows that
   the cloud reports PREEMPTED or FAILED, or no longer lists, are FAILED and their slice
   deleted. A preempted VM's workers are declared lost at once (``lose_worker``), so the
   controller retries their tasks within each job's preemption budget, through its usual
   lost-worker path.
2. **Boot**: a slice is READY only when the worker of every one of its hosts has registered;
   one not READY within ``boot_timeout`` is FAILED (``boot_deadline``) and deleted whole, and
   lowers its group's create rate. A READY slice whose worker is lost is FAILED (``lost``).
3. **Demand** is a dry run of Fray's own scheduler (:func:`fray.cluster.server.scheduler.schedule`)
   against the live workers: only jobs it cannot place count. They are routed to groups by
   priority (:mod:`fray.cluster.server.autoscale._demand`), using capacity already on its way first.
4. **Scale down**: a READY slice idle (no task on any of its hosts) for ``idle_seconds`` is
   DRAINING: the scheduler places nothing new on it and, still idle ``drain_seconds`` later,
   it is deleted; one that got work meanwhile is READY again. Never below ``min``.
5. **Create** the slices wanted (and each group's ``min``), limited by the group's create
   rate; a :class:`~fray.errors.QuotaExceeded` blocks the group for ``quota_block_seconds``
   and its demand goes to the next group in the same tick.

After the tick, the pending reasons of jobs and the status people read are built by
:mod:`fray.cluster.server.autoscale._status`.

The tick is a function of its inputs (the view, the provider's answers, ``now``), so tests
and the scale simulation drive it with a simulated clock. In the controller it runs on its
own thread (:mod:`fray.cluster.server.controller._autoscale_host`), so scheduling never waits on a provider.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fray.cluster.protocol.capacity import WorkerInfo
from fray.cluster.server.autoscale._createrate import CreateRate
from fray.cluster.server.autoscale._demand import Routing, Unit, group_vector, route
from fray.cluster.server.autoscale._status import BOOTING, GroupState, autoscaler_status, job_notes
from fray.cluster.server.autoscale._vmstate import SliceRecord, VmRecord, VmState, vm_worker_info
from fray.cluster.server.autoscale.config import ClusterConfig, ScaleGroup
from fray.cluster.server.autoscale.provider import CloudState, Provider, ProviderVm, SliceRequest, slice_vms
from fray.cluster.server.scheduler import PendingJob, RunningTask, schedule
from fray.core._timefmt import format_time
from fray.errors import CapacityUnavailable, ProviderError, QuotaExceeded

__all__ = ["Autoscaler", "AutoscalerPolicy", "ClusterView", "TickResult", "vm_worker_info"]

logger = logging.getLogger(__name__)

_LIVE = (VmState.REQUESTED, VmState.BOOTING, VmState.READY, VmState.DRAINING)
# Seconds a new slice may be absent from the provider's listing before it counts as lost.
_LISTING_GRACE = 30.0
# Seconds a DELETED or FAILED VM's worker stays fenced (see Autoscaler._fenced).
_FENCE_AFTER_END = 60.0
# Slice names tried for one create when the provider answers earlier names with no VMs (see _create_slice).
_NAME_TRIES = 1000


@dataclass(frozen=True)
class AutoscalerPolicy:
    """The autoscaler's numbers (``docs/autoscaling.md`` explains each)."""

    boot_timeout: float = 600.0
    """Seconds from create to READY before a slice is FAILED (``boot_deadline``) and deleted."""
    quota_block_seconds: float = 300.0
    """How long a group creates nothing after a :class:`~fray.errors.QuotaExceeded`."""
    unavailable_block_seconds: float = 60.0
    """How long a group creates nothing after a :class:`~fray.errors.CapacityUnavailable`."""
    create_rate: float = 2.0
    """Slices per second a healthy group may create (after a burst of ``create_burst``)."""
    create_burst: float = 8.0
    failure_factor: float = 0.5
    """Each boot failure multiplies the group's create rate by this ..."""
    rate_floor: float = 1.0 / 60.0
    """... down to at least this many slices per second."""
    recovery_seconds: float = 600.0
    """The rate climbs back linearly from the floor to ``create_rate`` over this many seconds."""
    drain_seconds: float = 2.0
    """How long a DRAINING slice must stay idle, with no new work placed on it, before it is deleted."""
    history: int = 1000
    """DELETED and FAILED VMs remembered for ``fray cluster vm list --all``."""

    @classmethod
    def for_config(cls, config: ClusterConfig) -> AutoscalerPolicy:
        """The policy for a cluster file: the provider kind's defaults, its ``boot_timeout`` and ``quota_block_seconds``."""
        simulated = config.provider.kind == "simulated"
        boot = config.provider.number("boot_timeout", 10.0 if simulated else 600.0)
        quota = config.provider.number("quota_block_seconds", 60.0 if simulated else 300.0)
        return cls(boot_timeout=boot, quota_block_seconds=quota, unavailable_block_seconds=min(quota, 60.0))


@dataclass(frozen=True)
class ClusterView:
    """What the controller knows, for one tick (plain values, read from one snapshot)."""

    pending: Sequence[PendingJob]
    workers: Sequence[WorkerInfo]
    """Workers the scheduler may use (alive and healthy)."""
    running: Sequence[RunningTask]
    credits: Mapping[str, float] = field(default_factory=dict)
    registered: frozenset[str] = frozenset()
    """Ids of every alive worker (healthy or not)."""
    lost: frozenset[str] = frozenset()
    """Ids of workers the controller declared lost (or revoked)."""
    unplaced: Sequence[PendingJob] | None = None
    """The pending jobs the controller's last scheduling pass could not place, in order: that pass *is* a
    dry run against the live workers, so the autoscaler need not run another (None: it runs its own)."""


@dataclass(frozen=True)
class TickResult:
    """What the controller must do after a tick."""

    fenced: frozenset[str]
    """Workers the scheduler must place no new work on: hosts of slices not READY, and DRAINING ones."""
    notes: Mapping[str, str]
    """job id -> its pending reason as the autoscaler sees it (waiting for VMs, or why demand is unmet)."""
    created: int = 0
    deleted: int = 0


class Autoscaler:
    """Keeps a cluster's scale groups sized to its demand through a :class:`Provider` (see the module docstring).

    ``lose_worker(worker_id, reason)`` is called at once for each registered worker of a
    slice that failed (a preemption): the controller's lost-worker path retries its tasks.
    ``stop_worker(worker_id, reason)`` is called for each registered worker of a slice deleted
    on purpose (scaled down): it is listed as stopped, not lost (default: ``lose_worker``).
    """

    def __init__(
        self,
        config: ClusterConfig,
        provider: Provider,
        *,
        policy: AutoscalerPolicy | None = None,
        clock: Callable[[], float] = time.time,
        lose_worker: Callable[[str, str], None] | None = None,
        stop_worker: Callable[[str, str], None] | None = None,
    ) -> None:
        self.config = config
        self.provider = provider
        self.policy = policy or AutoscalerPolicy.for_config(config)
        self._clock = clock
        self._lose_worker = lose_worker
        self._stop_worker = stop_worker or lose_worker
        self._groups_by_priority = config.by_priority()
        self._group_config = {g.name: g for g in config.scale_groups}
        now = clock()
        p = self.policy
        self._groups = {
            g.name: GroupState(
                CreateRate(p.create_rate, p.create_burst, p.failure_factor, p.rate_floor, p.recovery_seconds, now)
            )
            for g in config.scale_groups
        }
        self._slices: dict[str, SliceRecord] = {}
        self._undeleted: dict[str, str] = {}  # slice id -> group: deletes the provider has not confirmed
        self._history: deque[VmRecord] = deque(maxlen=p.history)
        self._next_index = dict.fromkeys(self._group_config, 0)
        self._id_re = re.compile(rf"^{re.escape(config.name)}-([a-z][a-z0-9-]*)-(\d+)$")
        self._stopped = False
        self._tick_lock = threading.RLock()
        self._publish_lock = threading.Lock()
        self._published_vms: list[VmRecord] = []
        self._published_status: dict[str, Any] = {"groups": [], "unmet": [], "unmet_count": 0}
        self._ticks = 0
        self._readied = False
        # Published before the first tick too: a status read then lists every group (with no VMs yet).
        self._publish(Routing(), self._clock())

    # ----- the tick -----------------------------------------------------------------------------

    def tick(self, view: ClusterView, now: float | None = None) -> TickResult:
        """Reconcile, boot, route demand, scale down and create, once (see the module docstring)."""
        with self._tick_lock:
            now = self._clock() if now is None else now
            self._ticks += 1
            self._readied = False  # set when a slice becomes READY in this tick
            created = deleted = 0
            self._retry_deletes()
            try:
                listing: Sequence[ProviderVm] | None = self.provider.list_vms()
            except ProviderError as exc:
                logger.warning("the %s provider could not list VMs: %s", self.provider.kind, exc)
                listing = None
            if listing is not None:
                deleted += self._reconcile(listing, now, view)
            deleted += self._boot(view, now)
            busy = {task.worker_id for task in view.running}
            deleted += self._drain(busy, now)
            routing = Routing()
            blocked_before: set[str] = set()
            # A group that refuses a create (quota) is blocked and the same tick routes its demand onward.
            unplaced = self._unplaced(view, now)
            for _ in range(len(self._groups) + 1):
                routing = self._route(unplaced, now)
                for slice_id in routing.kept:
                    kept = self._slices[slice_id]
                    kept.move(VmState.READY, now)
                    kept.drain_started = None
                    kept.idle_since = None
                self._start_drains(busy, routing, now)
                created += self._create(routing, now)
                blocked_now = {name for name, g in self._groups.items() if g.blocked_until > now}
                if blocked_now <= blocked_before:
                    break
                blocked_before = blocked_now
            notes = job_notes(routing, self._slices.values(), self._groups, self._group_config)
            self._publish(routing, now)
            return TickResult(self._fenced(now), notes, created, deleted)

    # -- reconcile with the provider's listing ---------------------------------------------------

    def _reconcile(self, listing: Sequence[ProviderVm], now: float, view: ClusterView) -> int:
        deleted = 0
        listed = slice_vms(listing)
        for slice_id, vms in listed.items():
            known = self._slices.get(slice_id)
            if known is None:
                if slice_id not in self._undeleted:
                    deleted += self._adopt(slice_id, vms, now)
                continue
            states = {vm.state for vm in vms}
            if CloudState.PREEMPTED in states:
                deleted += self._fail(known, "preempted", now, view)
            elif CloudState.FAILED in states:
                deleted += self._fail(known, "boot_failed" if known.state in BOOTING else "lost", now, view)
            elif len(vms) != len(known.vms) or CloudState.DELETING in states:
                deleted += self._fail(known, "lost", now, view)
            elif known.state == VmState.REQUESTED and states == {CloudState.RUNNING}:
                known.move(VmState.BOOTING, now)
        for slice_id, s in list(self._slices.items()):
            # A cloud's listing may lag its creates a little: only a slice past that grace is missing.
            if slice_id not in listed and now - s.created_at > _LISTING_GRACE:
                deleted += self._fail(s, "lost", now, view)
        for slice_id in [s for s in self._undeleted if s not in listed]:
            del self._undeleted[slice_id]
        return deleted

    def _adopt(self, slice_id: str, vms: Sequence[ProviderVm], now: float) -> int:
        """A slice of this cluster the autoscaler did not know (a controller restart): adopt it, or delete it."""
        group = self._group_config.get(vms[0].group)
        states = {vm.state for vm in vms}
        if group is None or len(vms) != group.hosts or states & {CloudState.PREEMPTED, CloudState.FAILED}:
            logger.info("deleting slice %s found at the provider: not a healthy slice of a configured group", slice_id)
            self._delete_at_provider(slice_id, vms[0].group)
            return len(vms)
        if CloudState.DELETING in states:
            return 0
        state = VmState.REQUESTED if CloudState.CREATING in states else VmState.BOOTING
        records = [VmRecord(vm.vm_id, slice_id, group.name, vm.host_index, state, vm.created_at) for vm in vms]
        self._slices[slice_id] = SliceRecord(slice_id, group.name, records, min(vm.created_at for vm in vms))
        match = self._id_re.match(slice_id)
        if match and match.group(1) == group.name:
            self._next_index[group.name] = max(self._next_index[group.name], int(match.group(2)) + 1)
        logger.info("adopted slice %s of group %s (%s)", slice_id, group.name, state.value)
        return 0

    # -- boot, loss, deadlines -------------------------------------------------------------------

    def _boot(self, view: ClusterView, now: float) -> int:
        deleted = 0
        for s in list(self._slices.values()):
            for vm in s.vms:
                if vm.vm_id in view.registered:
                    vm.registered = True
            if s.state in BOOTING:
                if all(vm.vm_id in view.registered for vm in s.vms):
                    if s.state == VmState.REQUESTED:
                        s.move(VmState.BOOTING, now)
                    s.move(VmState.READY, now)
                    self._readied = True
                elif now - s.created_at > self.policy.boot_timeout:
                    deleted += self._fail(s, "boot_deadline", now, view)
            elif any(vm.vm_id in view.lost for vm in s.vms):
                deleted += self._fail(s, "lost", now, view)
        return deleted

    def _fail(self, s: SliceRecord, reason: str, now: float, view: ClusterView) -> int:
        """The whole slice is FAILED for ``reason``: its live workers are lost (tasks retried), then it is deleted."""
        logger.warning("slice %s of group %s failed: %s", s.slice_id, s.group, reason)
        s.move(VmState.FAILED, now, reason)
        if self._lose_worker is not None:
            for vm in s.vms:
                if vm.vm_id in view.registered:
                    self._lose_worker(vm.vm_id, f"VM {vm.vm_id} {reason.replace('_', ' ')}")
        if reason in ("boot_failed", "boot_deadline"):
            self._groups[s.group].rate.boot_failed(now)
        self._forget(s)
        return len(s.vms)

    def _forget(self, s: SliceRecord) -> None:
        """Delete a finished slice at the provider and move its VMs to the history."""
        del self._slices[s.slice_id]
        self._history.extend(s.vms)
        self._delete_at_provider(s.slice_id, s.group)
        if s.state == VmState.DELETED and self._stop_worker is not None:
            # Its worker is stopping: out of the scheduler's sight now rather than after the worker timeout,
            # and listed as stopped: a scale-down is not a crash.
            for vm in s.vms:
                if vm.registered:
                    self._stop_worker(vm.vm_id, f"its VM {vm.vm_id} was deleted (scaled down)")

    def _delete_at_provider(self, slice_id: str, group: str) -> None:
        try:
            self.provider.delete_slice(slice_id)
        except ProviderError as exc:
            logger.warning("deleting slice %s failed (retried next tick): %s", slice_id, exc)
            self._undeleted[slice_id] = group
            if group in self._groups:
                self._groups[group].last_error = str(exc)
        else:
            self._undeleted.pop(slice_id, None)

    def _retry_deletes(self) -> None:
        for slice_id, group in list(self._undeleted.items()):
            self._delete_at_provider(slice_id, group)

    # -- scale-down ------------------------------------------------------------------------------

    def _drain(self, busy: set[str], now: float) -> int:
        """Follow idleness; delete DRAINING slices that stayed idle, keep those that got work."""
        deleted = 0
        for s in list(self._slices.values()):
            if s.state not in (VmState.READY, VmState.DRAINING):
                continue
            if any(vm.vm_id in busy for vm in s.vms):
                s.idle_since = None
                if s.state == VmState.DRAINING:
                    logger.info("slice %s got work while draining: kept", s.slice_id)
                    s.move(VmState.READY, now)
                    self._readied = True
                    s.drain_started = None
                continue
            if s.idle_since is None:
                s.idle_since = now
            draining_since = s.drain_started if s.state == VmState.DRAINING else None
            if draining_since is not None and now - draining_since >= self.policy.drain_seconds:
                logger.info("slice %s of group %s idle: deleted", s.slice_id, s.group)
                s.move(VmState.DELETED, now)
                self._forget(s)
                deleted += len(s.vms)
        return deleted

    def _start_drains(self, busy: set[str], routing: Routing, now: float) -> None:
        wanted = set(routing.served.values())
        for group in self._groups_by_priority:
            if group.name in wanted:
                continue  # demand is coming to this group: keep what it has
            mine = [s for s in self._slices.values() if s.group == group.name]
            staying = sum(1 for s in mine if s.state in (*BOOTING, VmState.READY))
            idle = sorted(
                (
                    s
                    for s in mine
                    if s.state == VmState.READY
                    and s.idle_since is not None
                    and now - s.idle_since >= self.config.idle_seconds
                ),
                key=lambda s: (s.idle_since, s.slice_id),
            )
            for s in idle:
                if staying <= group.min:
                    break
                s.move(VmState.DRAINING, now)
                s.drain_started = now
                staying -= 1

    # -- demand ----------------------------------------------------------------------------------

    def _counts(self) -> dict[str, int]:
        counts = dict.fromkeys(self._group_config, 0)
        for s in self._slices.values():
            counts[s.group] += 1
        return counts

    def _unplaced(self, view: ClusterView, now: float) -> Sequence[PendingJob]:
        """The demand: pending jobs a dry run of the scheduler cannot place on the live, unfenced workers."""
        # The controller's last pass is the dry run, unless a slice became READY since (that pass could not use it).
        if view.unplaced is not None and not self._readied:
            return view.unplaced
        if not view.pending:
            return ()
        fenced = self._fenced(now)
        workers = [w for w in view.workers if w.worker_id not in fenced] if fenced else view.workers
        decision = schedule(view.pending, workers, view.running, view.credits, now=now)
        return [job for job in view.pending if job.job_id in decision.pending]

    def _route(self, unplaced: Sequence[PendingJob], now: float) -> Routing:
        if not unplaced:
            return Routing()
        # Demand by band, as the scheduler places: a production job's demand is served (takes a group's
        # last slices under its ``max``) before a batch job's; within a band the order is kept (stable sort).
        unplaced = sorted(unplaced, key=lambda job: job.band)
        units: dict[str, list[Unit]] = {name: [] for name in self._group_config}
        for state in (VmState.DRAINING, VmState.REQUESTED, VmState.BOOTING):
            for s in self._slices.values():
                if s.state == state:
                    vector = list(group_vector(self._group_config[s.group]))
                    units[s.group].append(Unit(s.group, s.slice_id, vector, draining=state == VmState.DRAINING))
        blocked: dict[str, tuple[str, str]] = {}
        for name, group in self._groups.items():
            if self._stopped:
                blocked[name] = ("stopped", "is being deleted (fray cluster down)")
            elif group.blocked_until > now:
                # A fixed time, not a countdown: the reason of every job it holds stays the same until then.
                blocked[name] = (
                    group.blocked_code,
                    f"is {group.blocked_message} until {format_time(group.blocked_until)}",
                )
        return route(unplaced, self._groups_by_priority, self._counts(), blocked, units)

    # -- create ----------------------------------------------------------------------------------

    def _create(self, routing: Routing, now: float) -> int:
        created = 0
        counts = self._counts()
        for config in self._groups_by_priority:
            name = config.name
            group = self._groups[name]
            group.rate.advance(now)
            if self._stopped or group.blocked_until > now:
                group.wanted = 0
                continue
            staying = sum(1 for s in self._slices.values() if s.group == name and s.state != VmState.DRAINING)
            want = routing.new_slices.get(name, 0) + max(0, config.min - staying)
            want = min(want, config.max - counts[name])
            made = 0
            while made < want and group.rate.take():
                try:
                    self._create_slice(config, now)
                except QuotaExceeded as exc:
                    self._block(group, now, "quota_blocked", "quota-blocked", self.policy.quota_block_seconds, exc)
                    break
                except CapacityUnavailable as exc:
                    block = self.policy.unavailable_block_seconds
                    self._block(group, now, "unavailable", "out of capacity", block, exc)
                    break
                except ProviderError as exc:
                    logger.warning("creating a slice in group %s failed: %s", name, exc)
                    group.last_error = str(exc)
                    break
                made += 1
            group.wanted = max(0, want - made) if group.blocked_until <= now else 0
            created += made
        return created

    def _block(self, group: GroupState, now: float, code: str, words: str, seconds: float, exc: Exception) -> None:
        logger.warning("scale group blocked for %gs: %s", seconds, exc)
        group.blocked_until = now + seconds
        group.blocked_code = code
        group.blocked_message = words
        group.last_error = str(exc)

    def _create_slice(self, config: ScaleGroup, now: float) -> None:
        # The provider remembers request ids; one it answers with no VMs named a slice deleted before a
        # controller restart (the count starts again after the highest slice listed): take the next name.
        for _ in range(_NAME_TRIES):
            if self._create_named(config, now):
                return
        raise ProviderError(f"the provider made no VMs for {_NAME_TRIES} new slices of group {config.name}")

    def _create_named(self, config: ScaleGroup, now: float) -> bool:
        index = self._next_index[config.name]
        slice_id = f"{self.config.name}-{config.name}-{index}"
        vm_ids = (slice_id,) if config.hosts == 1 else tuple(f"{slice_id}-{i}" for i in range(config.hosts))
        attributes = {"scale-group": config.name}
        if config.is_slice:
            attributes["tpu-name"] = slice_id  # the provider adds each host's tpu-worker-id
        request = SliceRequest(
            request_id=slice_id,  # the slice id is the idempotency key: a repeated create makes nothing new
            group=config.name,
            slice_id=slice_id,
            vm_ids=vm_ids,
            resources=config.resources,
            attributes=attributes,
            preemptible=config.preemptible,
        )
        vms = self.provider.create_slice(request)
        self._next_index[config.name] = index + 1
        if not vms:
            return False
        running = bool(vms) and all(vm.state == CloudState.RUNNING for vm in vms)
        state = VmState.BOOTING if running else VmState.REQUESTED
        created_at = min((vm.created_at for vm in vms), default=now)
        records = [VmRecord(vm_id, slice_id, config.name, i, state, created_at) for i, vm_id in enumerate(vm_ids)]
        # The boot deadline runs on the autoscaler's clock from now, whatever the provider's clock says.
        self._slices[slice_id] = SliceRecord(slice_id, config.name, records, now)
        logger.info(
            "requested slice %s of group %s (%d host%s)", slice_id, config.name, config.hosts, "s"[: config.hosts > 1]
        )
        return True

    # ----- what the controller and people read --------------------------------------------------

    def _fenced(self, now: float) -> frozenset[str]:
        """Workers the scheduler must not use: hosts of slices not READY, and of slices ended lately.

        A deleted VM's worker may still answer for a moment (a cloud's delete takes time, and a worker
        told it was lost registers again): it stays fenced for :data:`_FENCE_AFTER_END` seconds.
        """
        fenced = {vm.vm_id for s in self._slices.values() if s.state != VmState.READY for vm in s.vms}
        for vm in reversed(self._history):
            if vm.ended_at is None or now - vm.ended_at > _FENCE_AFTER_END:
                break
            fenced.add(vm.vm_id)
        return frozenset(fenced)

    def _publish(self, routing: Routing, now: float) -> None:
        vms = [replace(vm) for s in self._slices.values() for vm in s.vms]
        status = autoscaler_status(
            self.provider.kind, self._groups_by_priority, self._groups, self._slices.values(), self._counts(),
            routing, stopped=self._stopped, ticks=self._ticks, now=now,
        )  # fmt: skip
        with self._publish_lock:
            self._published_vms = vms
            self._published_status = status

    def vms(self, include_deleted: bool = False) -> list[dict[str, Any]]:
        """Every live VM (and, with ``include_deleted``, the DELETED and FAILED ones remembered) as plain data."""
        with self._publish_lock:
            live = list(self._published_vms)
            ended = [replace(vm) for vm in self._history] if include_deleted else []
        return [vm.as_dict() for vm in ended + live]

    def status(self) -> dict[str, Any]:
        """Per group its state, target and VMs by state; unmet demand with machine-readable codes."""
        with self._publish_lock:
            return dict(self._published_status)

    def delete_all(self) -> int:
        """Stop creating and delete every slice (``fray cluster down``); returns how many VMs were deleted."""
        self._stopped = True
        with self._tick_lock:
            now = self._clock()
            count = 0
            try:
                listing = self.provider.list_vms()
            except ProviderError:
                listing = []
            for slice_id, vms in slice_vms(listing).items():
                if slice_id not in self._slices:
                    self._delete_at_provider(slice_id, vms[0].group)
                    count += len(vms)
            for s in list(self._slices.values()):
                s.move(VmState.DELETED, now)
                self._forget(s)
                count += len(s.vms)
            self._publish(Routing(), now)
            return count
