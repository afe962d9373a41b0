"""Free capacity indexed for best-fit queries, so a scheduling pass does not scan every worker per task.

Workers are grouped into *classes* of equal placement facts (region, preemptibility, which
accelerators they carry); the scheduler works out once per resource shape which classes a job
may use and how much it would rather not use them. Within a class, workers are bucketed by
their exact free vector (``(cpu, ram, disk, gpu, tpu)``), the buckets kept sorted, and each
bucket's worker ids kept sorted. Best fit (the fullest worker that still fits: smallest free
cpu, then ram, then worker id) is then a bisection to the first bucket with enough cpu and a
short forward scan, instead of a pass over all workers. Homogeneous fleets have few distinct
free vectors, so buckets stay few even with thousands of workers.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable, Iterable, Sequence

__all__ = ["FreeIndex"]

Free = tuple[int, ...]


class _Class:
    __slots__ = ("members", "shapes")

    def __init__(self) -> None:
        self.shapes: list[Free] = []  # distinct free vectors, sorted
        self.members: dict[Free, list[str]] = {}  # free vector -> sorted worker ids

    def add(self, wid: str, free: Free) -> None:
        ids = self.members.get(free)
        if ids is None:
            self.members[free] = [wid]
            insort(self.shapes, free)
        else:
            insort(ids, wid)

    def remove(self, wid: str, free: Free) -> None:
        ids = self.members[free]
        del ids[bisect_left(ids, wid)]
        if not ids:
            del self.members[free]
            del self.shapes[bisect_left(self.shapes, free)]

    def best(self, need: Sequence[int]) -> tuple[int, int, str] | None:
        """``(free cpu, free ram, worker id)`` of the best-fitting worker, or None if none fits."""
        shapes = self.shapes
        want_cpu, want_ram, want_disk, want_gpu, want_tpu = need
        found: tuple[int, int, str] | None = None
        for index in range(bisect_left(shapes, (want_cpu,)), len(shapes)):
            cpu, ram, disk, gpu, tpu = shapes[index]
            if found is not None and (cpu != found[0] or ram != found[1]):
                break  # past every bucket that ties with the one found on (cpu, ram)
            if ram >= want_ram and disk >= want_disk and gpu >= want_gpu and tpu >= want_tpu:
                wid = self.members[shapes[index]][0]
                if found is None or wid < found[2]:
                    found = (cpu, ram, wid)
        return found


class FreeIndex:
    """The free vectors of the workers a pass may still place on, by class, for best-fit queries.

    The owner keeps the authoritative free vectors; it reports every change with :meth:`move`
    and withdraws a worker (reserved for an older job) with :meth:`discard`.
    """

    def __init__(self, workers: Iterable[tuple[str, Hashable, Free]]) -> None:
        self._classes: dict[Hashable, _Class] = {}
        self._where: dict[str, tuple[_Class, Free]] = {}
        for wid, key, free in workers:
            cls = self._classes.get(key)
            if cls is None:
                cls = self._classes[key] = _Class()
            cls.add(wid, free)
            self._where[wid] = (cls, free)

    def move(self, wid: str, free: Free) -> None:
        """Worker ``wid`` now has ``free`` (no-op for a worker not indexed)."""
        where = self._where.get(wid)
        if where is None:
            return
        cls, old = where
        cls.remove(wid, old)
        cls.add(wid, free)
        self._where[wid] = (cls, free)

    def discard(self, wid: str) -> None:
        """Stop offering ``wid`` for the rest of the pass."""
        where = self._where.pop(wid, None)
        if where is not None:
            where[0].remove(wid, where[1])

    def best(self, levels: Sequence[Sequence[Hashable]], need: Sequence[int]) -> str | None:
        """The worker to place a task needing ``need`` on, or None when none fits.

        ``levels`` lists class keys from most to least preferred; the first level with a
        fitting worker wins, and within it the fullest fitting worker (smallest free cpu,
        then ram, then id).
        """
        for keys in levels:
            found: tuple[int, int, str] | None = None
            for key in keys:
                cls = self._classes.get(key)
                if cls is None:
                    continue
                candidate = cls.best(need)
                if candidate is not None and (found is None or candidate < found):
                    found = candidate
            if found is not None:
                return found[2]
        return None
