"""The scheduler as it was before the capacity index (kept only here, as the oracle of the property test).

A verbatim copy of the pass of ``fray.cluster.server.scheduler.schedule`` before it indexed free capacity:
every placement scans every suitable worker. ``tests/cluster/test_scheduler_index.py`` checks that
the indexed scheduler takes exactly the same decisions, and ``benchmarks/scheduler.py --compare``
times both. Do not edit it to follow later changes of the rules: it pins the old decisions.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fray.cluster.protocol.capacity import CPU, DIM_NAMES, RAM, TaskResources, WorkerInfo, format_amount
from fray.cluster.server.credit import bid, task_rate
from fray.cluster.server.scheduler import (
    NEVER_PREFIX,
    WAITING_PREFIX,
    Assignment,
    PendingJob,
    PendingReason,
    RunningTask,
    SchedulerPolicy,
    SchedulingDecision,
)
from fray.resources import TPU_TOPOLOGIES

__all__ = ["schedule"]


def _fmt_need(dim: int, value: int) -> str:
    """``'64 GiB RAM'``, ``'2 cores'``, ``'8 GPUs'``."""
    if dim == CPU:
        return format_amount(dim, value)
    return f"{format_amount(dim, value)} {DIM_NAMES[dim]}"


def _need(r: TaskResources) -> tuple[int, int, int, int, int]:
    gpu = r.device_count if r.device_kind == "gpu" else 0
    tpu = r.device_count if r.device_kind == "tpu" else 0
    return (r.cpu_millis, r.ram_bytes, r.disk_bytes, gpu, tpu)


def _capacity(w: WorkerInfo) -> list[int]:
    gpu = w.device("gpu")
    tpu = w.device("tpu")
    return [w.cpu_millis, w.ram_bytes, w.disk_bytes, gpu.count if gpu else 0, tpu.count if tpu else 0]


def _slots(free: Sequence[int], need: Sequence[int]) -> int:
    """How many tasks needing ``need`` fit into ``free``."""
    best = math.inf
    for have, want in zip(free, need, strict=True):
        if want > 0:
            best = min(best, max(0, have) // want)
    # A task that needs nothing at all fits any number of times; cap it to stay an int.
    return int(min(best, 1 << 30))


def _fits(free: Sequence[int], need: Sequence[int]) -> bool:
    return all(have >= want for have, want in zip(free, need, strict=True))


def _or(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


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


class _Pool:
    """Mutable free capacity of the alive workers during one pass."""

    def __init__(self, workers: Sequence[WorkerInfo], running: Sequence[RunningTask]) -> None:
        self.workers: dict[str, WorkerInfo] = {}
        self.capacity: dict[str, list[int]] = {}
        self.free: dict[str, list[int]] = {}
        for w in sorted(workers, key=lambda w: w.worker_id):
            if w.alive:
                self.workers[w.worker_id] = w
                self.capacity[w.worker_id] = _capacity(w)
                self.free[w.worker_id] = _capacity(w)
        for task in running:
            free = self.free.get(task.worker_id)
            if free is not None:
                for dim, want in enumerate(_need(task.resources)):
                    free[dim] -= want
        self.slices = self._find_slices()
        self.reserved: dict[str, str] = {}  # worker id -> job id holding it
        self._static: dict[TaskResources, _Static] = {}

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
                return ids, f"no {what} in region {_or(list(r.regions))} at all"
        if not r.preemptible:
            ids = [i for i in ids if not self.workers[i].preemptible]
            if not ids:
                where = f" in region {_or(list(r.regions))}" if r.regions is not None else ""
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
                return ok, f"{prefix} {_fmt_need(dim, want)} (largest: {largest} on {top})"
            ids = ok
        return ids, None

    def _static_plain(self, r: TaskResources) -> _Static:
        ids = list(self.workers)
        if not ids:
            return _Static("no workers are registered", [], [], 0)
        ids, why = self._constraint_filter(ids, r, "worker")
        if why is None and r.device_kind == "gpu":
            ids = [i for i in ids if _gpu_matches(self.workers[i], r.device_type)]
            if not ids:
                gpu = "GPUs" if r.device_type == "auto" else f"{r.device_type} GPUs"
                why = f"needs {gpu}; no suitable worker has any"
        if why is None:
            ids, why = self._capacity_filter(ids, _need(r), "no worker has")
        if why is not None:
            return _Static(why, [], [], 0)
        need = _need(r)
        slots = sum(_slots(self.capacity[i], need) for i in ids)
        return _Static(None, ids, [], slots)

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
        need = _need(r)
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
        r = job.resources
        need = _need(r)
        avail = [i for i in static.workers if i not in self.reserved]
        # Prefer workers without accelerators the job does not use, and preemptible workers
        # for jobs that tolerate preemption: both keep scarce hosts for the jobs that need
        # them. Then best fit: the fullest worker that still fits, so that large holes stay
        # open for large jobs.
        scarce = {
            i: (
                any(d.kind != r.device_kind for d in self.workers[i].devices),
                r.preemptible and not self.workers[i].preemptible,
            )
            for i in avail
        }
        chosen: list[str] = []
        for _ in range(job.replicas):
            best: str | None = None
            best_key: tuple[tuple[bool, bool], int, int, str] | None = None
            for i in avail:
                free = self.free[i]
                if _fits(free, need):
                    key = (scarce[i], free[CPU], free[RAM], i)
                    if best_key is None or key < best_key:
                        best, best_key = i, key
            if best is None:
                break
            self._take(best, need)
            chosen.append(best)
        if len(chosen) == job.replicas:
            return tuple(chosen)
        for i in chosen:
            self._give(i, need)
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
                return f"no worker has {_fmt_need(dim, want)} free (largest free: {largest} on {top}){suffix}"
        if not any(_fits(self.free[i], need) for i in avail):
            return f"no single worker has {job.resources.describe()} free at once{suffix}"
        now = sum(_slots(self.free[i], need) for i in avail)
        return f"gang of {job.replicas} replicas: only {now} fit now{suffix}"

    def _free_slices(self, static: _Static, need: Sequence[int]) -> list[_Slice]:
        free: list[_Slice] = []
        for name in static.slices:
            s = self.slices[name]
            hosts = s.hosts.values()
            if any(h in self.reserved for h in hosts):
                continue
            if all(_fits(self.free[h], need) for h in hosts):
                free.append(s)
        return free

    def _place_tpu(self, job: PendingJob, static: _Static) -> tuple[str, ...] | str:
        r = job.resources
        need = _need(r)
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
        need = _need(job.resources)

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
            return
        ranked_workers = sorted((i for i in static.workers if i not in self.reserved), key=lambda i: (deficit(i), i))
        covered = 0
        for wid in ranked_workers:
            if covered >= job.replicas:
                break
            self.reserved[wid] = job.job_id
            covered += _slots(self.capacity[wid], need)

    def _take(self, wid: str, need: Sequence[int]) -> None:
        free = self.free[wid]
        for dim, want in enumerate(need):
            free[dim] -= want

    def _give(self, wid: str, need: Sequence[int]) -> None:
        free = self.free[wid]
        for dim, want in enumerate(need):
            free[dim] += want


def _gpu_matches(w: WorkerInfo, gpu_type: str) -> bool:
    dev = w.device("gpu")
    return dev is not None and (gpu_type == "auto" or dev.type == gpu_type)


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
    policy = policy or SchedulerPolicy()
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

    queues: dict[str, deque[PendingJob]] = {}
    # Best priority band first, then submission order (issue 34: bands order the queue).
    for job in sorted(pending, key=lambda j: (j.band, j.submitted_at, j.job_id)):
        queues.setdefault(job.user, deque()).append(job)

    def user_bid(user: str) -> float:
        return bid(
            credits.get(user, policy.credit.initial_credit), user_rate.get(user, 0.0), policy.bid_horizon_seconds
        )

    bids = {user: user_bid(user) for user in queues}
    heap = [(q[0].band, -bids[u], q[0].submitted_at, q[0].job_id, u) for u, q in queues.items()]
    heapq.heapify(heap)

    assignments: list[Assignment] = []
    reasons: dict[str, PendingReason] = {}
    # Free capacity only shrinks during a pass, so a shape that did not fit keeps not fitting:
    # remembering it makes a sweep of identical jobs cost one placement attempt, not one each.
    failed: dict[tuple[TaskResources, int], str] = {}
    reserved_shapes: set[tuple[TaskResources, int]] = set()
    while heap:
        *_, user = heapq.heappop(heap)
        job = queues[user].popleft()
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
        else:
            shape = (job.resources, job.replicas)
            known_failure = failed.get(shape)
            result = known_failure if known_failure is not None else pool.place(job, static)
            if isinstance(result, tuple):
                assignments.append(Assignment(job.job_id, result))
                user_rate[user] = user_rate.get(user, 0.0) + rate(job.resources) * job.task_count
            else:
                failed[shape] = result
                reasons[job.job_id] = PendingReason(job.job_id, WAITING_PREFIX + result, satisfiable=True)
                starving = (
                    policy.reserve_after_seconds is not None and now - job.submitted_at >= policy.reserve_after_seconds
                )
                if starving and shape not in reserved_shapes:
                    reserved_shapes.add(shape)
                    pool.reserve(job, static)
        if queues[user]:
            head = queues[user][0]
            heapq.heappush(heap, (head.band, -user_bid(user), head.submitted_at, head.job_id, user))
    return SchedulingDecision(tuple(assignments), reasons, bids)
