"""Resource vectors for placement: what a task needs, what a worker has, and how many tasks fit.

A vector is ``(cpu millis, ram bytes, disk bytes, GPUs, TPU chips)``, the dimensions of
:mod:`fray.cluster.protocol.capacity`. :mod:`fray.cluster.server.scheduler` places tasks with these, and
words its pending reasons with :func:`need_text` and :func:`one_of`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fray.cluster.protocol.capacity import CPU, DIM_NAMES, TaskResources, WorkerInfo, format_amount

__all__ = ["capacity_of", "fits", "gpu_matches", "need_of", "need_text", "one_of", "slots_for"]


def need_text(dim: int, value: int) -> str:
    """``'64 GiB RAM'``, ``'2 cores'``, ``'8 GPUs'``."""
    if dim == CPU:
        return format_amount(dim, value)
    return f"{format_amount(dim, value)} {DIM_NAMES[dim]}"


def need_of(r: TaskResources) -> tuple[int, int, int, int, int]:
    """What one task of ``r`` needs, as a vector."""
    gpu = r.device_count if r.device_kind == "gpu" else 0
    tpu = r.device_count if r.device_kind == "tpu" else 0
    return (r.cpu_millis, r.ram_bytes, r.disk_bytes, gpu, tpu)


def capacity_of(w: WorkerInfo) -> list[int]:
    """What worker ``w`` has in all, as a vector."""
    gpu = w.device("gpu")
    tpu = w.device("tpu")
    return [w.cpu_millis, w.ram_bytes, w.disk_bytes, gpu.count if gpu else 0, tpu.count if tpu else 0]


def slots_for(free: Sequence[int], need: Sequence[int]) -> int:
    """How many tasks needing ``need`` fit into ``free``."""
    best = math.inf
    for have, want in zip(free, need, strict=True):
        if want > 0:
            best = min(best, max(0, have) // want)
    # A task that needs nothing at all fits any number of times; cap it to stay an int.
    return int(min(best, 1 << 30))


def fits(free: Sequence[int], need: Sequence[int]) -> bool:
    """Whether one task needing ``need`` fits into ``free``."""
    return all(have >= want for have, want in zip(free, need, strict=True))


def one_of(items: Sequence[str]) -> str:
    """``"a"``, ``"a or b"``, ``"a, b or c"``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def gpu_matches(w: WorkerInfo, gpu_type: str) -> bool:
    """Whether ``w`` has GPUs of ``gpu_type`` (``"auto"``: any)."""
    dev = w.device("gpu")
    return dev is not None and (gpu_type == "auto" or dev.type == gpu_type)
