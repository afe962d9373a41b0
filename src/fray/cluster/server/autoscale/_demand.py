"""Routing unplaceable demand to scale groups: which group would take each job, and how many slices that needs.

Pure: the autoscaler passes the jobs its dry run of the scheduler could not place (in the
scheduler's order), the groups by priority, and the capacity already on its way (slices
REQUESTED or BOOTING, and DRAINING slices that could be kept instead). Each job is tried on
each group in priority order; a group takes a job only whole (a gang is one entry) and
falls through when it does not fit the job, is at its ``max`` or is blocked after a quota
error. Jobs with the same shape are common (a sweep), so a shape that failed on a group
is not tried there again in the same pass: capacity only shrinks while routing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fray.cluster.protocol.capacity import TaskResources, format_bytes
from fray.cluster.server.autoscale.config import ScaleGroup
from fray.cluster.server.scheduler import PendingJob
from fray.resources import TPU_TOPOLOGIES

__all__ = ["Routing", "Unit", "Unmet", "group_vector", "route"]

# Why a group did not take a job (machine-readable codes; docs/autoscaling.md lists them).
NO_FIT = "no_fit"
AT_MAX = "at_max"
NO_GROUP_FITS = "no_group_fits"


@dataclass
class Unit:
    """One slice's worth of capacity on its way: the free vector of each of its (identical) hosts."""

    group: str
    slice_id: str | None  # None: a slice to create
    free: list[int]
    draining: bool = False
    used: bool = False


@dataclass(frozen=True)
class Unmet:
    """Why a job's demand cannot be served now: a code, each tried group's code, and a sentence."""

    code: str
    groups: Mapping[str, str]
    message: str
    never: bool = False

    def as_dict(self, job_id: str) -> dict[str, Any]:
        """The ``autoscaler_status()`` entry of ``job_id``."""
        return {
            "job_id": job_id,
            "code": self.code,
            "never": self.never,
            "groups": dict(self.groups),
            "message": self.message,
        }


@dataclass
class Routing:
    """The outcome of :func:`route`."""

    new_slices: dict[str, int] = field(default_factory=dict)
    """Slices to create per group."""
    kept: set[str] = field(default_factory=set)
    """DRAINING slices wanted again (back to READY)."""
    served: dict[str, str] = field(default_factory=dict)
    """job id -> the group whose slices (on their way) will take it."""
    unmet: dict[str, Unmet] = field(default_factory=dict)
    """job id -> why no group can take it now."""


def group_vector(group: ScaleGroup) -> tuple[int, int, int, int, int]:
    """What one host of the group offers, as the scheduler's ``(cpu millis, ram, disk, gpu, tpu)``."""
    gpu = tpu = 0
    for device in group.resources.devices:
        kind, _, count = device.split(":")
        if kind == "gpu":
            gpu = int(count)
        elif kind == "tpu":
            tpu = int(count)
    res = group.resources
    return (round(res.cpu * 1000), res.ram_bytes, res.disk_bytes, gpu, tpu)


def _device(group: ScaleGroup) -> tuple[str, str] | None:
    for device in group.resources.devices:
        kind, dtype, _ = device.split(":")
        return kind, dtype
    return None


def _need(r: TaskResources) -> tuple[int, int, int, int, int]:
    gpu = r.device_count if r.device_kind == "gpu" else 0
    tpu = r.device_count if r.device_kind == "tpu" else 0
    return (r.cpu_millis, r.ram_bytes, r.disk_bytes, gpu, tpu)


def _slots(free: Sequence[int], need: Sequence[int]) -> int:
    best = 1 << 30
    for have, want in zip(free, need, strict=True):
        if want > 0:
            best = min(best, max(0, have) // want)
    return best


def describe_group(group: ScaleGroup) -> str:
    """``"cpu (2 cores, 2 GiB RAM, 100 GiB disk per VM, max 3)"``."""
    res = group.resources
    parts = [f"{res.cpu:g} core{'s' if res.cpu != 1 else ''}", f"{format_bytes(res.ram_bytes)} RAM"]
    parts.append(f"{format_bytes(res.disk_bytes)} disk")
    parts.extend(res.devices)
    unit = f"{group.hosts}-host slice" if group.is_slice else "VM"
    return f"{group.name} ({', '.join(parts)} per {'host' if group.is_slice else 'VM'}; max {group.max} {unit}s)"


@dataclass(frozen=True)
class _Fit:
    """How a job shape uses a group: items per job, items per fresh slice, slices needed from scratch."""

    group: ScaleGroup
    items: int
    per_slice: int
    need: tuple[int, int, int, int, int]

    @property
    def slices_from_scratch(self) -> int:
        return math.ceil(self.items / self.per_slice)


def _fit(group: ScaleGroup, r: TaskResources, replicas: int) -> _Fit | str:
    """How ``group`` could run a job of ``replicas`` x ``r``, or why it never can."""
    if r.regions is not None:
        return f"needs region {', '.join(r.regions)}; scale groups have no region"
    if not r.preemptible and group.preemptible:
        return "needs a non-preemptible VM; the group is preemptible"
    device = _device(group)
    if r.device_kind == "cpu":
        if device is not None:
            return f"has {device[0].upper()}s the job does not use"
    elif device is None or device[0] != r.device_kind:
        return f"has no {r.device_kind.upper()}"
    elif r.device_kind == "gpu" and r.device_type not in ("auto", device[1]):
        return f"has {device[1]} GPUs, the job needs {r.device_type}"
    elif r.device_kind == "tpu":
        topo = TPU_TOPOLOGIES[r.device_type]
        if device[1] != r.device_type:
            return f"has {device[1]} TPUs, the job needs {r.device_type}"
        if group.hosts != topo.hosts:
            return f"slices of {group.hosts} hosts, a {r.device_type} slice has {topo.hosts}"
    need = _need(r)
    have = group_vector(group)
    for dim, name in enumerate(("cores", "RAM", "disk", "GPUs", "TPU chips")):
        if need[dim] > have[dim]:
            return f"too small: the job needs more {name} per task than a VM has"
    per_host = _slots(have, need)
    if r.device_kind == "tpu":
        items, per_slice = replicas, per_host  # one replica runs on every host of a slice
    elif not group.is_slice:
        items, per_slice = replicas, per_host  # one task per replica, any VMs of the group
    elif group.hosts == replicas:
        items, per_slice = 1, per_host  # the gang spans one slice, a task on each host
    else:
        return f"slices of {group.hosts} hosts, the gang has {replicas} replicas"
    fit = _Fit(group, items, per_slice, need)
    if fit.slices_from_scratch > group.max:
        return f"needs {fit.slices_from_scratch} slices or VMs, above its max {group.max}"
    return fit


def route(
    jobs: Sequence[PendingJob],
    groups: Sequence[ScaleGroup],
    counts: Mapping[str, int],
    blocked: Mapping[str, tuple[str, str]],
    units: Mapping[str, list[Unit]],
) -> Routing:
    """Route ``jobs`` (unplaceable now, in scheduling order) to ``groups`` (by priority).

    ``counts``: each group's slices counting toward its max (everything not DELETED or
    FAILED, DRAINING included); ``blocked``: group -> ``(code, sentence)`` for groups that
    may not create now; ``units``: each group's capacity on its way (DRAINING slices first).
    Units are consumed as jobs are routed; new units are added for slices to create.
    """
    routing = Routing()
    shapes: dict[tuple[TaskResources, int], _Shape] = {}
    unmet_cache: dict[tuple[tuple[str, str], ...], Unmet] = {}
    pools = {g.name: list(units.get(g.name, ())) for g in groups}
    new = dict.fromkeys((g.name for g in groups), 0)
    largest = max(groups, key=lambda g: (group_vector(g), g.hosts, g.max, g.name)) if groups else None
    for job in jobs:
        shape = shapes.get((job.resources, job.replicas))
        if shape is None:
            shape = shapes[(job.resources, job.replicas)] = _shape(job, groups, largest)
        if shape.done is not None:
            # Every group already refused this shape in this pass (capacity only shrinks): the same answer.
            routing.unmet[job.job_id] = shape.done
            continue
        tried: list[tuple[str, str]] = []
        for fit in shape.options:
            name = fit.group.name
            known = shape.exhausted.get(name)
            if known is not None:
                tried.append((name, known))
                continue
            pool = pools[name]
            start = shape.cursor.get(name, 0)
            while start < len(pool) and _slots(pool[start].free, fit.need) == 0:
                start += 1
            shape.cursor[name] = start  # units before it can never take this shape again in this pass
            wanted = fit.items
            taken: list[tuple[Unit, int]] = []
            for index in range(start, len(pool)):
                if wanted <= 0:
                    break
                unit = pool[index]
                slots = min(_slots(unit.free, fit.need), wanted)
                if slots:
                    taken.append((unit, slots))
                    wanted -= slots
            extra = math.ceil(wanted / fit.per_slice) if wanted > 0 else 0
            if extra:
                block = blocked.get(name)
                if block is not None:
                    shape.exhausted[name] = block[0]
                    tried.append((name, block[0]))
                    continue
                if counts.get(name, 0) + new[name] + extra > fit.group.max:
                    shape.exhausted[name] = AT_MAX
                    tried.append((name, AT_MAX))
                    continue
            for unit, slots in taken:
                _use(unit, fit.need, slots, routing)
            if extra:
                new[name] += extra
                vector = list(group_vector(fit.group))
                for _ in range(extra):
                    unit = Unit(name, None, list(vector))
                    pool.append(unit)
                    take = min(_slots(unit.free, fit.need), wanted)
                    _use(unit, fit.need, take, routing)
                    wanted -= take
            routing.served[job.job_id] = name
            break
        else:
            codes = tuple(tried)
            cached = unmet_cache.get(codes)
            if cached is None:
                cached = unmet_cache[codes] = _unmet(codes, {g.name: g for g in groups}, blocked)
            routing.unmet[job.job_id] = cached
            if len(shape.exhausted) == len(shape.options):
                shape.done = cached
    routing.new_slices = {name: count for name, count in new.items() if count}
    return routing


@dataclass
class _Shape:
    """What routing learnt about one job shape (resources, replicas) in a pass."""

    options: list[_Fit]
    done: Unmet | None = None  # set once no group can take it any more in this pass
    exhausted: dict[str, str] = field(default_factory=dict)  # group -> why it can no longer take the shape
    cursor: dict[str, int] = field(default_factory=dict)  # group -> first of its units that may still fit it


def _shape(job: PendingJob, groups: Sequence[ScaleGroup], largest: ScaleGroup | None) -> _Shape:
    found = [(g, _fit(g, job.resources, job.replicas)) for g in groups]
    usable = [f for _, f in found if isinstance(f, _Fit)]
    if usable:
        return _Shape(usable)
    why = "; ".join(f"{g.name}: {f}" for g, f in found)
    biggest = f" The largest group is {describe_group(largest)}." if largest else ""
    message = f"no scale group can ever fit it ({why}).{biggest}"
    return _Shape([], done=Unmet(NO_GROUP_FITS, {}, message, never=True))


def _use(unit: Unit, need: Sequence[int], slots: int, routing: Routing) -> None:
    for dim, want in enumerate(need):
        unit.free[dim] -= want * slots
    unit.used = True
    if unit.draining and unit.slice_id is not None:
        routing.kept.add(unit.slice_id)


def _unmet(
    tried: tuple[tuple[str, str], ...], groups: Mapping[str, ScaleGroup], blocked: Mapping[str, tuple[str, str]]
) -> Unmet:
    parts = []
    for name, code in tried:
        if code == AT_MAX:
            parts.append(f"{name} is at its max of {groups[name].max}")
        else:
            parts.append(f"{name} {blocked[name][1]}" if name in blocked else f"{name}: {code}")
    return Unmet(tried[0][1] if tried else NO_FIT, dict(tried), "no scale group can take it now: " + "; ".join(parts))
