"""The job level against Ray, in one run: tasks, objects and queues.

Run by hand (it starts its own local Ray, and with ``--cluster`` its own Fray cluster)::

    python benchmarks/tasks.py              # ~3-5 minutes on 2 cores
    python benchmarks/tasks.py --quick      # smaller sizes, a smoke test
    python benchmarks/tasks.py --cluster    # also the Fray cluster's context and durable queue
    python benchmarks/tasks.py --cluster --queues   # only the queue rows (a few minutes)
    python benchmarks/tasks.py --cluster --queues --monarch   # and Monarch's actor-backed queue

Rows (medians over ``--rounds`` alternating rounds; the ratio to raw Ray is what counts
on a noisy machine):

* trivial task round trip: ``get(create_task(noop))`` one after another;
* N trivial tasks submitted, then gathered with one ``get``: tasks/s;
* ``put`` + ``get`` of 100 MB in the driver, and ``put`` + one task that reads it;
* a queue item through ``push`` -> ``pop`` -> ``done``: items/s (3 calls each); Ray's peer
  is ``ray.util.queue.Queue`` (an actor queue without leases: ``put`` + ``get``);
* the same from 4 threads at once on one queue (the cluster's group commit shares
  transactions between them);
* items in batches of 100: ``push_many`` -> ``pop_many(100)`` -> ``done_many`` (3 calls per
  100 items, each one transaction on the cluster); Ray's peer is ``put_nowait_batch`` +
  ``get_nowait_batch``.

Columns: raw Ray, and Fray's contexts: threads (``LocalJobContext``), processes
(``ProcessJobContext(2)``), Fray-on-Ray (``RayJobContext``), the Fray cluster; with
``--monarch``, Monarch's queue (the generic actor-backed one; queue rows only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MB100 = 100 * 1024 * 1024
BATCH = 100  # items per push_many / pop_many / done_many
THREADS = 4  # callers at once in the concurrent queue row


def noop(value: int = 0) -> int:
    """The task every side runs."""
    return value


def size_of(blob: Any) -> int:
    return len(blob)


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


class Side:
    """One column: how to run a task, gather many, put and get, and pass a queue item through."""

    def __init__(self, name: str, context: Any = None, queue: Any = None) -> None:
        self.name = name
        self.context = context
        self.queue = queue

    def round_trip(self) -> Any:
        return self.context.get(self.context.create_task(noop, 1))

    def gather(self, count: int) -> Any:
        create = self.context.create_task
        return self.context.get([create(noop, i) for i in range(count)])

    def put_get(self, blob: bytes) -> Any:
        return self.context.get(self.context.put(blob))

    def put_task(self, blob: bytes) -> Any:
        return self.context.get(self.context.create_task(size_of, self.context.put(blob)))

    def queue_items(self, count: int) -> None:
        queue = self.queue
        for i in range(count):
            queue.push(i)
            lease = queue.pop(lease_timeout=60)
            queue.done(lease)

    def queue_batches(self, count: int) -> None:
        queue = self.queue
        for start in range(0, count, BATCH):
            queue.push_many(range(start, start + BATCH))
            leases = queue.pop_many(BATCH, lease_timeout=60)
            assert len(leases) == BATCH
            queue.done_many(leases)

    def queue_threads(self, count: int) -> None:
        """``queue_items`` from THREADS threads at once, ``count`` items in all (each pop finds an item)."""
        workers = [threading.Thread(target=self.queue_items, args=(count // THREADS,)) for _ in range(THREADS)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()


class RawRay(Side):
    def __init__(self) -> None:
        from ray.util.queue import Queue

        import ray

        super().__init__("raw Ray")
        self.ray = ray
        self.task = ray.remote(max_retries=0)(noop)
        self.size = ray.remote(max_retries=0)(size_of)
        self.queue = Queue()

    def round_trip(self) -> Any:
        return self.ray.get(self.task.remote(1))

    def gather(self, count: int) -> Any:
        remote = self.task.remote
        return self.ray.get([remote(i) for i in range(count)])

    def put_get(self, blob: bytes) -> Any:
        return self.ray.get(self.ray.put(blob))

    def put_task(self, blob: bytes) -> Any:
        return self.ray.get(self.size.remote(self.ray.put(blob)))

    def queue_items(self, count: int) -> None:
        for i in range(count):
            self.queue.put(i)
            self.queue.get()

    def queue_batches(self, count: int) -> None:
        for start in range(0, count, BATCH):
            self.queue.put_nowait_batch(list(range(start, start + BATCH)))
            assert len(self.queue.get_nowait_batch(BATCH)) == BATCH


def measure(
    sides: list[Side], rounds: int, sizes: dict[str, int], queues_only: bool = False
) -> list[tuple[str, str, list[float]]]:
    """Every row for every side (only the queue rows with ``queues_only``), rounds alternating between sides; medians."""
    rows: list[tuple[str, str, Callable[[Side], float]]] = [
        (
            "trivial task round trip",
            "µs",
            lambda s: median_time(s.round_trip, sizes["sync"]) * 1e6,
        ),
        (
            f"{sizes['tasks']:,} tasks submitted then gathered",
            "tasks/s",
            lambda s: sizes["tasks"] / median_time(lambda: s.gather(sizes["tasks"]), 1),
        ),
        ("put + get of 100 MB (driver)", "ms", lambda s: median_time(lambda: s.put_get(BLOB), 1) * 1e3),
        ("put 100 MB + a task reads it", "ms", lambda s: median_time(lambda: s.put_task(BLOB), 1) * 1e3),
        (
            "queue push→pop→done",
            "items/s",
            lambda s: sizes["queue"] / median_time(lambda: s.queue_items(sizes["queue"]), 1),
        ),
        (
            f"queue push→pop→done, {THREADS} threads",
            "items/s",
            lambda s: sizes["queue"] / median_time(lambda: s.queue_threads(sizes["queue"]), 1),
        ),
        (
            f"queue batches of {BATCH}: push_many→pop_many→done_many",
            "items/s",
            lambda s: sizes["batches"] / median_time(lambda: s.queue_batches(sizes["batches"]), 1),
        ),
    ]
    results = []
    for label, unit, run in rows:
        if queues_only and not label.startswith("queue"):
            continue
        samples: dict[str, list[float]] = {side.name: [] for side in sides}
        for _ in range(rounds):
            for side in sides:
                has_it = side.queue is not None if label.startswith("queue") else side.context is not None
                if not has_it and not isinstance(side, RawRay):
                    continue
                samples[side.name].append(run(side))
        results.append(
            (label, unit, [statistics.median(samples[s.name]) if samples[s.name] else float("nan") for s in sides])
        )
        print(f"  measured: {label}", flush=True)
    return results


BLOB = b""


def main() -> None:
    global BLOB
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per measurement")
    parser.add_argument("--cluster", action="store_true", help="also measure the Fray cluster (starts one)")
    parser.add_argument("--queues", action="store_true", help="only the queue rows")
    parser.add_argument("--monarch", action="store_true", help="also Monarch's queue (an actor of a MonarchClient)")
    args = parser.parse_args()
    sizes = (
        {"sync": 100, "tasks": 2000, "queue": 300, "batches": 2000}
        if args.quick
        else {"sync": 300, "tasks": 10_000, "queue": 2000, "batches": 20_000}
    )
    BLOB = b"" if args.queues else b"\x01" * MB100

    import fray
    import ray
    from fray.local import LocalClient
    from fray.ray import RayClient

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray_client = RayClient(namespace="bench-tasks")
    local_client = LocalClient()
    threads = fray.LocalJobContext(client=local_client)
    processes = fray.ProcessJobContext(2, client=local_client)
    sides: list[Side] = [
        RawRay(),
        Side("Fray threads", threads, local_client.create_queue("bench")),
        Side("Fray processes", processes),
        Side("Fray on Ray", ray_client._fray_job_context(), ray_client.create_queue("bench")),
    ]
    monarch_client = None
    if args.monarch:
        # benchmarks/monarch.py would shadow the monarch package: import it without this folder on the path.
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
        from fray.monarch import MonarchClient

        monarch_client = MonarchClient()
        sides.append(Side("Fray on Monarch", None, monarch_client.create_queue("bench")))
    cluster = None
    if args.cluster:
        from fray.cluster.client import ClusterClient
        from fray.cluster.server.launcher import LocalCluster

        cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="fray-bench-tasks-")))
        cluster.start_controller()
        cluster.add_worker("worker-0", "--cpu", "2")
        cluster.wait_for_workers(1)
        cluster_client = ClusterClient(cluster.address, token=cluster.token)
        sides.append(Side("Fray cluster", cluster_client._fray_job_context(), cluster_client.create_queue("bench")))
    try:
        for side in sides:  # warm up: worker processes, function exports, code paths
            if args.queues:
                if side.queue is not None:
                    side.queue_items(50)
                    side.queue_batches(BATCH)
            elif side.context is not None or isinstance(side, RawRay):
                side.gather(200)
                side.round_trip()
        print(f"sizes: {sizes}, rounds: {args.rounds}", flush=True)
        results = measure(sides, args.rounds, sizes, queues_only=args.queues)
    finally:
        processes.shutdown()
        threads.shutdown()
        ray_client.shutdown(wait=False)
        local_client.shutdown(wait=False)
        ray.shutdown()
        if monarch_client is not None:
            monarch_client.shutdown(wait=False)
        if cluster is not None:
            cluster.stop()
    names = [side.name for side in sides]
    print()
    print("Each Fray cell: the figure, then its ratio to raw Ray (> 1: Fray does better).")
    print()
    print("| what | unit | " + " | ".join(names) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in names) + " |")
    for label, unit, values in results:
        raw = values[0]
        higher_is_better = unit.endswith("/s")
        cells = [f"{raw:,.0f}"]
        for value in values[1:]:
            if value != value:  # NaN: this side has no such row
                cells.append("—")
                continue
            ratio = value / raw if higher_is_better else raw / value
            cells.append(f"{value:,.0f} ({ratio:.2f}x)")
        print(f"| {label} | {unit} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
