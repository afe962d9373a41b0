"""One scheduling pass over a mixed simulated load, at 100/1k/10k pending jobs x 100/1k workers.

Run from the repository root::

    python benchmarks/scheduler.py              # the growth table, ~10 s
    python benchmarks/scheduler.py --compare    # also the scheduler before the capacity index, ~1 min

The load (seeded, the same for every run): workers are 70 % CPU hosts (16 cores, 64 GiB, in two regions, a
third non-preemptible), 10 % GPU hosts (8 H100 or A100, 32 cores), 20 % TPU hosts in v5litepod-16 slices of
4 hosts; a third of the capacity is busy with running tasks. Pending jobs are 1-core jobs (50 %), gangs of
4-16 two-core replicas (15 %), GPU jobs of 1-8 GPUs (10 %), TPU jobs of 1-2 slices (8 %), jobs pinned to a
region and to non-preemptible hosts (10 %) and jobs that can never fit (7 %), from 20 users, submitted over
the last 1,000 s, so the oldest ones reserve workers (the default 300 s).

With ``--compare`` the table has the pass of the scheduler before it indexed free capacity (the test
oracle ``tests/cluster/_old_scheduler.py``, timed once per size: it is slow) and checks both decide the
same. Goal: one pass at 10,000 pending x 1,000 workers <= 0.5 s.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fray.cluster.protocol.capacity import Device, TaskResources, WorkerInfo
from fray.cluster.server.scheduler import PendingJob, RunningTask, SchedulingDecision, schedule

GiB = 1 << 30
NOW = 1000.0
REGIONS = ("us-central1", "europe-west4")
SLICE = "v5litepod-16"  # 4 hosts of 4 chips


def make_workers(count: int, rng: random.Random) -> list[WorkerInfo]:
    workers: list[WorkerInfo] = []
    tpu_hosts = (count * 20 // 100) // 4 * 4
    gpu_hosts = count * 10 // 100
    for i in range(count - tpu_hosts - gpu_hosts):
        attrs = {"region": rng.choice(REGIONS), "preemptible": "false" if rng.random() < 1 / 3 else "true"}
        workers.append(WorkerInfo(f"cpu-{i:05d}", 16_000, 64 * GiB, 500 * GiB, (), attrs))
    for i in range(gpu_hosts):
        gpu = Device("gpu", rng.choice(("H100", "A100")), 8)
        attrs = {"region": rng.choice(REGIONS), "preemptible": "false"}
        workers.append(WorkerInfo(f"gpu-{i:05d}", 32_000, 256 * GiB, 1000 * GiB, (gpu,), attrs))
    for s in range(tpu_hosts // 4):
        region = rng.choice(REGIONS)
        for h in range(4):
            attrs = {"region": region, "tpu-name": f"slice-{s:04d}", "tpu-worker-id": str(h)}
            workers.append(
                WorkerInfo(f"tpu-{s:04d}-{h}", 32_000, 128 * GiB, 500 * GiB, (Device("tpu", SLICE, 4),), attrs)
            )
    rng.shuffle(workers)
    return workers


def make_running(workers: list[WorkerInfo], rng: random.Random) -> list[RunningTask]:
    """Tasks that hold about a third of the capacity."""
    running: list[RunningTask] = []
    busy_slices = {w.attributes["tpu-name"] for w in workers if "tpu-name" in w.attributes if rng.random() < 1 / 3}
    for w in workers:
        user = f"user-{rng.randrange(20):02d}"
        tpu = w.device("tpu")
        if tpu is not None:
            if w.attributes["tpu-name"] in busy_slices:
                r = TaskResources(8000, 16 * GiB, 10 * GiB, "tpu", SLICE, 4)
                running.append(RunningTask(w.worker_id, user, r))
            continue
        gpu = w.device("gpu")
        if gpu is not None:
            for _ in range(rng.randrange(0, 6)):
                running.append(RunningTask(w.worker_id, user, TaskResources(2000, 16 * GiB, 0, "gpu", gpu.type, 1)))
            continue
        for _ in range(rng.randrange(0, 11)):  # 0-10 of 16 cores: a third on average
            running.append(RunningTask(w.worker_id, user, TaskResources(1000, 2 * GiB, GiB)))
    return running


def make_pending(count: int, rng: random.Random) -> list[PendingJob]:
    jobs: list[PendingJob] = []
    for i in range(count):
        user = f"user-{rng.randrange(20):02d}"
        at = rng.uniform(0, NOW)
        kind = rng.random()
        replicas = 1
        if kind < 0.50:
            r = TaskResources(1000, 2 * GiB, GiB)
        elif kind < 0.65:
            r = TaskResources(2000, 4 * GiB, GiB)
            replicas = rng.randint(4, 16)
        elif kind < 0.75:
            r = TaskResources(4000, 32 * GiB, 10 * GiB, "gpu", rng.choice(("auto", "H100")), rng.choice((1, 2, 4, 8)))
        elif kind < 0.83:
            r = TaskResources(8000, 16 * GiB, 10 * GiB, "tpu", SLICE, 4)
            replicas = rng.randint(1, 2)
        elif kind < 0.93:
            r = TaskResources(2000, 8 * GiB, GiB, preemptible=False, regions=(rng.choice(REGIONS),))
        else:
            # Never fits: more RAM than any host, or a GPU type nobody has.
            r = rng.choice((TaskResources(1000, 4096 * GiB, GiB), TaskResources(1000, GiB, GiB, "gpu", "B200", 1)))
        jobs.append(PendingJob(f"job-{i:06d}", user, replicas, r, at))
    return jobs


def load(pending: int, workers: int) -> tuple[list[PendingJob], list[WorkerInfo], list[RunningTask]]:
    rng = random.Random(pending * 7919 + workers)
    w = make_workers(workers, rng)
    return make_pending(pending, rng), w, make_running(w, rng)


def timed(fn: Callable[[], SchedulingDecision], repeats: int) -> tuple[list[float], SchedulingDecision]:
    times: list[float] = []
    decision: SchedulingDecision | None = None
    for _ in range(repeats):
        start = time.perf_counter()
        decision = fn()
        times.append(time.perf_counter() - start)
    assert decision is not None
    return times, decision


def row(pending: int, workers: int, repeats: int, old: Any) -> str:
    """One table row: the pass at this size (and the old pass, when ``old`` is the oracle module)."""
    jobs, ws, running = load(pending, workers)
    times, decision = timed(lambda: schedule(jobs, ws, running, {}, now=NOW), repeats)
    median = statistics.median(times)
    spread = (max(times) - min(times)) / median
    text = (
        f"| {pending:>7} | {workers:>7} | {len(decision.assignments):>6} | {median * 1e3:>9.1f} |"
        f" {spread:>5.0%} | {median / pending * 1e6:>6.1f} |"
    )
    if old is not None:
        before, old_decision = timed(lambda: old.schedule(jobs, ws, running, {}, now=NOW), 1)
        if old_decision != decision:
            raise SystemExit(f"decisions differ at {pending} x {workers}")
        text += f" {before[0] * 1e3:>11.1f} | {before[0] / median:>7.1f}x |"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", action="store_true", help="also time the scheduler before the index")
    parser.add_argument("--repeats", type=int, default=5, help="passes per size (median reported)")
    args = parser.parse_args()
    old: Any = None
    if args.compare:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from cluster import _old_scheduler as old

    header = f"| {'pending':>7} | {'workers':>7} | {'placed':>6} | {'pass (ms)':>9} | {'spread':>6} | {'us/job':>6} |"
    rule = f"| {'-' * 7}: | {'-' * 7}: | {'-' * 6}: | {'-' * 9}: | {'-' * 6}: | {'-' * 6}: |"
    if old is not None:
        header += f" {'before (ms)':>11} | {'speed-up':>8} |"
        rule += f" {'-' * 11}: | {'-' * 8}: |"
    print(f"\nOne schedule() pass, median of {args.repeats} (spread = (max - min) / median)\n")
    print(header)
    print(rule)
    for workers in (100, 1000):
        for pending in (100, 1000, 10_000):
            print(row(pending, workers, args.repeats, old), flush=True)
    print("\nGoal: <= 500 ms at 10,000 pending x 1,000 workers." + (" Decisions identical." if old else ""))


if __name__ == "__main__":
    main()
