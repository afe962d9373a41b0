"""Where pending jobs run: fitting gangs of tasks onto workers, ordered by credit.

Everything here is a pure function of its arguments (no clock, no I/O), so the
controller can call :func:`schedule` as often as it likes and tests can replay any
situation. The rules, in brief (``docs/scheduler.md`` has the long form):

* A job has ``replicas`` replicas; each replica is one task, except on TPUs where a
  replica is a whole slice and runs one task per host of the slice. A job is placed
  all at once (*gang scheduling*) or not at all.
* A task fits a worker when the worker is alive, satisfies the job's constraints
  (region, ``preemptible=False`` needs a worker whose ``preemptible`` attribute is
  false, the accelerator kind and type) and has enough *free* cpu, ram, disk and
  accelerators. Free = capacity minus what the worker's assigned and running tasks
  asked for.
* Jobs are considered best priority band first (1 production, 2 interactive, 3 batch);
  within a band, in order of their user's *bid* (see :mod:`fray.cluster.server.credit`),
  highest first, ties broken by submit time. Each placement lowers its user's bid
  for the rest of the pass, so users' jobs interleave. (Which running work of a worse
  band a job that does not fit may preempt is :mod:`fray.cluster.server.scheduler._preempt`.)
* A job that does not fit is skipped and the jobs behind it are still tried
  (*backfill*). Backfill alone can starve a large job forever behind a stream of
  small ones, so once a job has waited ``reserve_after_seconds`` it *reserves* the
  workers closest to fitting it (just enough for its gang): jobs behind it in the
  order may no longer use those workers, which therefore drain until it fits.
* Every job left pending gets a reason, which says whether the job can *never* be
  placed with the workers currently registered or is *waiting* for capacity.

The vector arithmetic of placement (what a task needs, what a worker has, how many fit)
is in :mod:`fray.cluster.server.scheduler._fit`.

The package also holds the resource vectors (:mod:`fray.cluster.server.scheduler._fit`) and the
free-capacity index (:mod:`fray.cluster.server.scheduler._freeindex`) the scheduler places
with.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fray.cluster.protocol.capacity import TaskResources, WorkerInfo, format_amount
from fray.cluster.server.credit import bid, task_rate
from fray.cluster.server.scheduler._fit import capacity_of, fits, gpu_matches, need_of, need_text, one_of, slots_for
from fray.cluster.server.scheduler._freeindex import FreeIndex
from fray.cluster.server.scheduler._queue import PendingQueue, PendingReasons, Shape, queue_order
from fray.cluster.server.scheduler._values import (
    Assignment,
    PendingJob,
    PendingReason,
    RunningTask,
    SchedulerPolicy,
    SchedulingDecision,
)
from fray.resources import TPU_TOPOLOGIES

__all__ = [
    "Assignment",
    "PendingJob",
    "PendingQueue",
    "PendingReason",
    "PendingReasons",
    "RunningTask",
    "SchedulerPolicy",
    "SchedulingDecision",
    "Shape",
    "queue_order",
    "schedule",
    "schedule_queue",
]


@dataclass
class _Slice:
    """The alive hosts of one TPU slice, as found among the workers."""

    name: str
    type: str | None
    hosts: dict[int, str]  # tpu-worker-id -> worker id
    expected_hosts: int
    problem: str  # empty when the slice is complete


@dataclass
class _Static:
    """What a resource shape can use when every worker is idle (cached per shape in a pass)."""

    never: str | None
    workers: list[str]  # eligible workers (non-TPU)
    slices: list[str]  # eligible complete slices (TPU)
    slots: int  # non-TPU: tasks that fit on all eligible workers when idle
    # Non-TPU: the worker classes (see _Pool.klass) of ``workers``, most preferred first.
    levels: tuple[tuple[_ClassKey, ...], ...] = ()


# Placement facts shared by a class of workers: region, preemptible, device kinds, GPU type.
_ClassKey = tuple[str | None, bool, tuple[str, ...], str | None]


class _Pool:
    """Mutable free capacity of the alive workers during one pass."""

    def __init__(self, workers: Sequence[WorkerInfo], running: Sequence[RunningTask]) -> None:
        self.workers: dict[str, WorkerInfo] = {}
        self.capacity: dict[str, list[int]] = {}
        self.free: dict[str, list[int]] = {}
        # Attributes parsed once per pass, not once per job and worker.
        self.preemptible: dict[str, bool] = {}
        self.klass: dict[str, _ClassKey] = {}
        for w in sorted(workers, key=lambda w: w.worker_id):
            if w.alive:
                wid = w.worker_id
                self.workers[wid] = w
                self.capacity[wid] = capacity_of(w)
                self.free[wid] = capacity_of(w)
                self.preemptible[wid] = w.preemptible
                gpu = w.device("gpu")
                kinds = tuple(sorted(d.kind for d in w.devices))
                self.klass[wid] = (w.region, self.preemptible[wid], kinds, gpu.type if gpu else None)
        for task in running:
            free = self.free.get(task.worker_id)
            if free is not None:
                for dim, want in enumerate(need_of(task.resources)):
                    free[dim] -= want
        self.slices = self._find_slices()
        self.reserved: dict[str, str] = {}  # worker id -> job id holding it
        self._static: dict[TaskResources, _Static] = {}
        # Free capacity of the unreserved workers, for best-fit placement without a scan.
        self.index = FreeIndex((wid, self.klass[wid], tuple(free)) for wid, free in self.free.items())

    def _find_slices(self) -> dict[str, _Slice]:
        members: dict[str, list[WorkerInfo]] = {}
        for w in self.workers.values():
            tpu = w.device("tpu")
            if tpu is None:
                continue
            name = w.tpu_name
            if name is None:
                topo = TPU_TOPOLOGIES.get(tpu.type)
                if topo is None or topo.hosts != 1:
                    continue  # a multi-host slice needs tpu-name to know which hosts belong together
                # A single-host slice without tpu-name is a slice of its own.
                name = w.worker_id
            members.setdefault(name, []).append(w)
        slices: dict[str, _Slice] = {}
        for name, hosts in members.items():
            types = sorted({dev.type for h in hosts if (dev := h.device("tpu")) is not None})
            stype = types[0] if len(types) == 1 else None
            topo = TPU_TOPOLOGIES.get(stype) if stype else None
            expected = topo.hosts if topo else 0
            by_id: dict[int, str] = {}
            problem = ""
            if stype is None:
                problem = f"its hosts report different TPU types {types}"
            elif topo is None:
                problem = f"its type {stype!r} is not a known TPU slice type"
            for h in hosts:
                wid = h.tpu_worker_id if h.tpu_name is not None else 0
                if wid is None:
                    problem = problem or f"host {h.worker_id} has no valid tpu-worker-id"
                elif wid in by_id:
                    problem = problem or f"hosts {by_id[wid]} and {h.worker_id} share tpu-worker-id {wid}"
                else:
                    by_id[wid] = h.worker_id
            if not problem and set(by_id) != set(range(expected)):
                problem = f"only {len(by_id)} of its {expected} hosts are registered"
            slices[name] = _Slice(name, stype, by_id, expected, problem)
        return slices

    # -- what a shape could use on an idle cluster ------------------------------------------

    def static(self, r: TaskResources) -> _Static:
        cached = self._static.get(r)
        if cached is None:
            cached = self._static_tpu(r) if r.device_kind == "tpu" else self._static_plain(r)
            self._static[r] = cached
        return cached

    def _constraint_filter(self, ids: list[str], r: TaskResources, what: str) -> tuple[list[str], str | None]:
        """Apply region and preemptibility; return survivors or why none survive."""
        if r.regions is not None:
            ids = [i for i in ids if self.workers[i].region in r.regions]
            if not ids:
                return ids, f"no {what} in region {one_of(list(r.regions))} at all"
        if not r.preemptible:
            ids = [i for i in ids if not self.preemptible[i]]
            if not ids:
                where = f" in region {one_of(list(r.regions))}" if r.regions is not None else ""
                return ids, f"needs a non-preemptible {what}; none registered{where}"
        return ids, None

    def _capacity_filter(self, ids: list[str], need: Sequence[int], prefix: str) -> tuple[list[str], str | None]:
        for dim, want in enumerate(need):
            if want <= 0:
                continue
            ok = [i for i in ids if self.capacity[i][dim] >= want]
            if not ok:
                top = max(ids, key=lambda i: (self.capacity[i][dim], i))
                largest = format_amount(dim, self.capacity[top][dim])
                return ok, f"{prefix} {need_text(dim, want)} (largest: {largest} on {top})"
            ids = ok
        return ids, None

    def _static_plain(self, r: TaskResources) -> _Static:
        ids = list(self.workers)
        if not ids:
            return _Static("no workers are registered", [], [], 0)
        ids, why = self._constraint_filter(ids, r, "worker")
        if why is None and r.device_kind == "gpu":
            ids = [i for i in ids if gpu_matches(self.workers[i], r.device_type)]
            if not ids:
                gpu = "GPUs" if r.device_type == "auto" else f"{r.device_type} GPUs"
                why = f"needs {gpu}; no suitable worker has any"
        if why is None:
            ids, why = self._capacity_filter(ids, need_of(r), "no worker has")
        if why is not None:
            return _Static(why, [], [], 0)
        need = need_of(r)
        slots = sum(slots_for(self.capacity[i], need) for i in ids)
        # Prefer workers without accelerators the job does not use, and preemptible workers
        # for jobs that tolerate preemption: both keep scarce hosts for the jobs that need them.
        by_level: dict[tuple[bool, bool], set[_ClassKey]] = {}
        for i in ids:
            _, preemptible, kinds, _ = key = self.klass[i]
            scarce = (any(kind != r.device_kind for kind in kinds), r.preemptible and not preemptible)
            by_level.setdefault(scarce, set()).add(key)
        levels = tuple(tuple(by_level[level]) for level in sorted(by_level))
        return _Static(None, ids, [], slots, levels)

    def _static_tpu(self, r: TaskResources) -> _Static:
        topo = r.tpu
        assert topo is not None
        label = f"TPU slice {r.device_type} ({topo.hosts} host{'s' if topo.hosts != 1 else ''})"
        same_type = [s for s in self.slices.values() if s.type == r.device_type]
        if not same_type:
            return _Static(f"needs {label}; no {r.device_type} slice is registered", [], [], 0)
        complete = [s for s in same_type if not s.problem]
        if not complete:
            broken = min(same_type, key=lambda s: s.name)
            return _Static(f"needs {label}; no complete one (slice {broken.name}: {broken.problem})", [], [], 0)
        ok: list[str] = []
        why: str | None = None
        need = need_of(r)
        for s in sorted(complete, key=lambda s: s.name):
            hosts = list(s.hosts.values())
            survivors, why_c = self._constraint_filter(hosts, r, f"{r.device_type} slice")
            if why_c is None and len(survivors) != len(hosts):
                why_c = f"no {r.device_type} slice satisfies the constraints on all of its hosts"
            if why_c is None:
                survivors, why_c = self._capacity_filter(hosts, need, f"no {r.device_type} slice host has")
                if why_c is None and len(survivors) != len(hosts):
                    why_c = f"no {r.device_type} slice has {r.describe()} on every host"
            if why_c is None:
                ok.append(s.name)
            elif why is None:
                why = why_c
        if not ok:
            return _Static(why, [], [], 0)
        return _Static(None, [], ok, 0)

    # -- placing against free capacity ---------------------------------------------------

    def place(self, job: PendingJob, static: _Static) -> tuple[str, ...] | str:
        """Worker ids for every task of ``job`` (capacity taken), or why it does not fit now."""
        if job.resources.device_kind == "tpu":
            return self._place_tpu(job, static)
        return self._place_plain(job, static)

    def _place_plain(self, job: PendingJob, static: _Static) -> tuple[str, ...] | str:
        need = need_of(job.resources)
        # Best fit among the most preferred workers that fit (see _static_plain for the
        # preference): the fullest worker that still fits, so that large holes stay open for
        # large jobs; the index answers without scanning every worker.
        chosen: list[str] = []
        for _ in range(job.replicas):
            best = self.index.best(static.levels, need)
            if best is None:
                break
            self._take(best, need)
            chosen.append(best)
        if len(chosen) == job.replicas:
            return tuple(chosen)
        for i in chosen:
            self._give(i, need)
        avail = [i for i in static.workers if i not in self.reserved]
        return self._why_plain(job, static, avail, need)

    def _why_plain(self, job: PendingJob, static: _Static, avail: list[str], need: Sequence[int]) -> str:
        held = len(static.workers) - len(avail)
        if not avail:
            holder = self.reserved[static.workers[0]]
            return f"all {len(static.workers)} suitable workers are held for job {holder}, which has waited longest"
        suffix = f" ({held} suitable worker{'s' if held != 1 else ''} held for an older job)" if held else ""
        for dim, want in enumerate(need):
            if want <= 0:
                continue
            top = max(avail, key=lambda i: (self.free[i][dim], i))
            if self.free[top][dim] < want:
                largest = format_amount(dim, max(0, self.free[top][dim]))
                return f"no worker has {need_text(dim, want)} free (largest free: {largest} on {top}){suffix}"
        if not any(fits(self.free[i], need) for i in avail):
            return f"no single worker has {job.resources.describe()} free at once{suffix}"
        now = sum(slots_for(self.free[i], need) for i in avail)
        return f"gang of {job.replicas} replicas: only {now} fit now{suffix}"

    def _free_slices(self, static: _Static, need: Sequence[int]) -> list[_Slice]:
        free: list[_Slice] = []
        for name in static.slices:
            s = self.slices[name]
            hosts = s.hosts.values()
            if any(h in self.reserved for h in hosts):
                continue
            if all(fits(self.free[h], need) for h in hosts):
                free.append(s)
        return free

    def _place_tpu(self, job: PendingJob, static: _Static) -> tuple[str, ...] | str:
        r = job.resources
        need = need_of(r)
        free = self._free_slices(static, need)
        if len(free) < job.replicas:
            held = sum(1 for n in static.slices if any(h in self.reserved for h in self.slices[n].hosts.values()))
            suffix = f"; {held} held for an older job" if held else ""
            hosts = r.hosts_per_replica
            if job.replicas == 1:
                what = f"needs TPU slice {r.device_type} ({hosts} host{'s' if hosts != 1 else ''})"
            else:
                what = f"needs {job.replicas} TPU slices {r.device_type} ({hosts} hosts each)"
            if not free:
                detail = f"no complete free slice ({len(static.slices)} suitable, all busy{suffix})"
            else:
                detail = f"only {len(free)} of {len(static.slices)} suitable slices free{suffix}"
            return f"{what}; {detail}"
        workers: list[str] = []
        for s in free[: job.replicas]:
            for host_id in range(s.expected_hosts):
                wid = s.hosts[host_id]
                self._take(wid, need)
                workers.append(wid)
        return tuple(workers)

    def reserve(self, job: PendingJob, static: _Static) -> None:
        """Hold the workers closest to fitting ``job`` (enough for its gang) for it alone."""
        need = need_of(job.resources)

        def deficit(wid: str) -> float:
            # Fraction of the worker that must drain before one task fits.
            worst = 0.0
            for dim, want in enumerate(need):
                cap = self.capacity[wid][dim]
                if want > 0 and cap > 0:
                    worst = max(worst, max(0, want - self.free[wid][dim]) / cap)
            return worst

        if job.resources.device_kind == "tpu":
            ranked = sorted(
                (n for n in static.slices if not any(h in self.reserved for h in self.slices[n].hosts.values())),
                key=lambda n: (sum(deficit(h) for h in self.slices[n].hosts.values()), n),
            )
            for name in ranked[: job.replicas]:
                for h in self.slices[name].hosts.values():
                    self.reserved.setdefault(h, job.job_id)
                    self.index.discard(h)
            return
        ranked_workers = sorted((i for i in static.workers if i not in self.reserved), key=lambda i: (deficit(i), i))
        covered = 0
        for wid in ranked_workers:
            if covered >= job.replicas:
                break
            self.reserved[wid] = job.job_id
            self.index.discard(wid)
            covered += slots_for(self.capacity[wid], need)

    def _take(self, wid: str, need: Sequence[int]) -> None:
        free = self.free[wid]
        for dim, want in enumerate(need):
            free[dim] -= want
        self.index.move(wid, tuple(free))

    def _give(self, wid: str, need: Sequence[int]) -> None:
        free = self.free[wid]
        for dim, want in enumerate(need):
            free[dim] += want
        self.index.move(wid, tuple(free))


NEVER_PREFIX = "can never be scheduled with the current workers: "
WAITING_PREFIX = "waiting for capacity: "


def _starving(job: PendingJob, policy: SchedulerPolicy, now: float) -> bool:
    """True once ``job`` has waited long enough to reserve workers (see :class:`SchedulerPolicy`)."""
    return _starving_since(job.submitted_at, policy, now)


def _starving_since(submitted_at: float, policy: SchedulerPolicy, now: float) -> bool:
    return policy.reserve_after_seconds is not None and now - submitted_at >= policy.reserve_after_seconds


def schedule(
    pending: Sequence[PendingJob],
    workers: Sequence[WorkerInfo],
    running: Sequence[RunningTask],
    credits: Mapping[str, float],
    *,
    now: float,
    policy: SchedulerPolicy | None = None,
) -> SchedulingDecision:
    """Decide which pending jobs start now and where; give a reason for every other one.

    ``workers`` are all registered workers (dead ones are ignored), ``running`` every
    task currently holding capacity (assigned or running), ``credits`` each user's
    balance (a user missing from it has the policy's initial credit), ``now`` the
    current time on the same clock as ``PendingJob.submitted_at``.

    Never over-commits a worker, never places part of a gang, and places each TPU
    replica on all hosts of one complete slice.
    """
    by_user: dict[str, list[PendingJob]] = {}
    for job in sorted(pending, key=queue_order):
        by_user.setdefault(job.user, []).append(job)
    assignments, reasons, _, bids = _pass(by_user, None, workers, running, credits, now, policy or SchedulerPolicy())
    return SchedulingDecision(assignments, reasons, bids)


def schedule_queue(
    queue: PendingQueue,
    workers: Sequence[WorkerInfo],
    running: Sequence[RunningTask],
    credits: Mapping[str, float],
    *,
    now: float,
    policy: SchedulerPolicy | None = None,
) -> SchedulingDecision:
    """:func:`schedule` over a queue kept sorted and counted by shape: the same decision, at a cost flat in its length.

    The pass stops as soon as every shape still waiting is *settled* (it cannot fit the free
    capacity left, or can never fit, and no job of it still has to reserve workers): each job
    behind that point would only be given its shape's reason, with nothing placed, reserved or
    re-bid, so its decision is known without looking. The decision's ``pending`` is then a
    :class:`~fray.cluster.server.scheduler._queue.PendingReasons`: every pending job's reason, read
    lazily, with the jobs looked at (:attr:`~._queue.PendingReasons.explicit`) apart from the
    rest (:attr:`~._queue.PendingReasons.by_shape`), so that a caller that kept the last reasons
    grouped by shape writes only the ones that changed.
    """
    assignments, reasons, settled, bids = _pass(
        queue.by_user, queue.shapes, workers, running, credits, now, policy or SchedulerPolicy()
    )
    placed = {a.job_id for a in assignments}
    by_shape = {shape: PendingReason("", message, satisfiable) for shape, (message, satisfiable, _) in settled.items()}
    return SchedulingDecision(assignments, PendingReasons(queue.jobs, placed, reasons, by_shape), bids)


def _pass(
    by_user: Mapping[str, Sequence[PendingJob]],
    shapes: Mapping[Shape, tuple[int, float]] | None,
    workers: Sequence[WorkerInfo],
    running: Sequence[RunningTask],
    credits: Mapping[str, float],
    now: float,
    policy: SchedulerPolicy,
) -> tuple[tuple[Assignment, ...], dict[str, PendingReason], dict[Shape, tuple[str, bool, bool]], dict[str, float]]:
    """One pass over ``by_user`` (each user's jobs in :func:`queue_order`): assignments, reasons, settled shapes, bids.

    The heap takes the user whose next job has the best band, then the highest bid: since each
    user's jobs are sorted band first, every job of a band is looked at before any of a worse one.

    With ``shapes`` (each shape's job count and oldest submit time), the pass stops once every
    shape left is settled for all its remaining jobs; the jobs not looked at get their shape's
    settled reason (see :func:`schedule_queue`). Without, every job gets its reason here.
    """
    pool = _Pool(workers, running)
    rates: dict[TaskResources, float] = {}

    def rate(r: TaskResources) -> float:
        value = rates.get(r)
        if value is None:
            value = rates[r] = task_rate(r.cpu_millis, r.ram_bytes, r.device_kind, r.device_count, policy.credit)
        return value

    user_rate: dict[str, float] = {}
    for task in running:
        user_rate[task.user] = user_rate.get(task.user, 0.0) + rate(task.resources)

    queues: dict[str, deque[PendingJob]] = {user: deque(jobs) for user, jobs in by_user.items() if jobs}

    # A user's bid changes only when one of their jobs is placed: cached until then, since
    # a long queue of one user's jobs would otherwise recompute it once per job.
    current_bids: dict[str, float] = {}

    def user_bid(user: str) -> float:
        value = current_bids.get(user)
        if value is None:
            value = current_bids[user] = bid(
                credits.get(user, policy.credit.initial_credit), user_rate.get(user, 0.0), policy.bid_horizon_seconds
            )
        return value

    bids = {user: user_bid(user) for user in queues}
    heap = [(q[0].band, -bids[u], q[0].submitted_at, q[0].job_id, u) for u, q in queues.items()]
    heapq.heapify(heap)

    assignments: list[Assignment] = []
    reasons: dict[str, PendingReason] = {}
    # Free capacity only shrinks during a pass, so a shape that did not fit keeps not fitting:
    # remembering it makes a sweep of identical jobs cost one placement attempt, not one each.
    failed: dict[tuple[TaskResources, int], str] = {}
    reserved_shapes: set[tuple[TaskResources, int]] = set()
    # Shapes whose jobs are *settled* for the rest of the pass: their reason, whether it is satisfiable,
    # and whether it holds for every such job (a shape that can never fit, or one that failed and already
    # reserved) or only for those not yet starving. A settled job changes nothing -- no placement, no
    # reservation, no bid -- so it is given its reason without going through the heap: the order of
    # every other job, and so every decision, is the same as if it had been looked at in turn.
    settled: dict[Shape, tuple[str, bool, bool]] = {}
    # The shapes some remaining job of which may still need a look: once none is left, the pass is over
    # (see schedule_queue). Each shape's count drops as its jobs are placed.
    left = dict(shapes.items()) if shapes is not None else {}
    open_shapes = {shape for shape, (count, _) in left.items() if count > 0}

    def close(shape: Shape) -> None:
        """Drop ``shape`` from the open ones if it is settled for every job of it that is left."""
        entry = settled[shape]
        if shape in left and (entry[2] or not _starving_since(left[shape][1], policy, now)):
            open_shapes.discard(shape)

    def settle(job: PendingJob) -> bool:
        """Give ``job`` its reason at once if its shape settled it; False if it needs a look."""
        entry = settled.get((job.resources, job.replicas))
        if entry is None or not (entry[2] or not _starving(job, policy, now)):
            return False
        reasons[job.job_id] = PendingReason(job.job_id, entry[0], satisfiable=entry[1])
        return True

    def requeue(user: str) -> None:
        """Put ``user`` back in line with their next job that needs a look, if they have one."""
        queue = queues[user]
        # Once no shape is open, the jobs left are the tail the decision gives their shapes' reasons.
        while queue and (shapes is None or open_shapes) and settle(queue[0]):
            queue.popleft()
        if queue:
            head = queue[0]
            heapq.heappush(heap, (head.band, -user_bid(user), head.submitted_at, head.job_id, user))

    while heap:
        if shapes is not None and not open_shapes:
            break  # every job left would only be given its shape's settled reason
        *_, user = heapq.heappop(heap)
        job = queues[user].popleft()
        if settle(job):
            requeue(user)
            continue
        shape = (job.resources, job.replicas)
        known_failure = failed.get(shape)
        static = pool.static(job.resources)
        never = static.never
        if never is None and job.resources.device_kind != "tpu" and static.slots < job.replicas:
            never = f"gang of {job.replicas} replicas: at most {static.slots} fit even with every suitable worker idle"
        if never is None and job.resources.device_kind == "tpu" and len(static.slices) < job.replicas:
            never = (
                f"needs {job.replicas} complete {job.resources.device_type} slices; "
                f"only {len(static.slices)} suitable registered"
            )
        if never is not None:
            reasons[job.job_id] = PendingReason(job.job_id, NEVER_PREFIX + never, satisfiable=False)
            settled[shape] = (NEVER_PREFIX + never, False, True)
            close(shape)
        else:
            result = known_failure if known_failure is not None else pool.place(job, static)
            if isinstance(result, tuple):
                assignments.append(Assignment(job.job_id, result))
                user_rate[user] = user_rate.get(user, 0.0) + rate(job.resources) * job.task_count
                current_bids.pop(user, None)
                if shape in left:
                    count, oldest = left[shape]
                    left[shape] = (count - 1, oldest)
                    if count == 1:
                        open_shapes.discard(shape)
            else:
                failed[shape] = result
                reasons[job.job_id] = PendingReason(job.job_id, WAITING_PREFIX + result, satisfiable=True)
                if _starving(job, policy, now) and shape not in reserved_shapes:
                    reserved_shapes.add(shape)
                    pool.reserve(job, static)
                settled[shape] = (WAITING_PREFIX + result, True, shape in reserved_shapes)
                close(shape)
        requeue(user)
    return tuple(assignments), reasons, settled, bids
