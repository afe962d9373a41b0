"""What Fray adds on top of Ray: the same actor calls and tasks, raw Ray vs Fray-on-Ray, in one run.

Run by hand (it starts its own local Ray and stops it at the end)::

    python benchmarks/ray_overhead.py            # default sizes, ~1-2 minutes on 2 cores
    python benchmarks/ray_overhead.py --quick    # smaller sizes, a smoke test

Machines like ours are noisy (20-50 % drift between runs), so raw Ray and Fray are
measured in one process: latency calls alternate one by one (raw, Fray, raw, ...),
throughput batches alternate, and every row reports the median over rounds; the ratio
column is what matters. "Tasks" on the Fray side are jobs
(``client.submit(JobRequest(...))`` then ``wait()``, or ``fray.wait_all`` on the batch), the only
way Fray runs a function; raw Ray gathers its tasks with one ``ray.get`` in both rows.
Target: Fray adds <= 10 % latency and loses <= 10 % throughput.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any


class Echo:
    """The actor both sides call."""

    def ping(self, value: int = 0) -> int:
        return value


def noop(value: int = 0) -> int:
    """The task both sides run."""
    return value


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def throughput(run_batch: Callable[[int], None], count: int) -> float:
    start = time.perf_counter()
    run_batch(count)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--rounds", type=int, default=5, help="alternating raw/Fray rounds per measurement")
    args = parser.parse_args()
    sync_calls, async_calls, sync_tasks, async_tasks = (300, 1000, 100, 300) if args.quick else (1000, 3000, 300, 1000)

    import ray
    from fray import Entrypoint, JobRequest, ResourceConfig, wait_all
    from fray.ray import RayClient

    # A cluster of this process's own (ray.shutdown() stops exactly it), in its own temp dir.
    temp_dir = tempfile.mkdtemp(prefix="fray-bench-ray-", dir="/tmp")
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _temp_dir=temp_dir,
    )
    client = RayClient(namespace="bench")
    try:
        # The same resources on both sides: Fray maps ResourceConfig(cpu=1, ram=...) to these options.
        raw_actor = ray.remote(Echo).options(num_cpus=0).remote()
        fray_actor = client.create_actor(Echo, name="echo", resources=ResourceConfig(cpu=0))
        raw_task = ray.remote(max_retries=0)(noop).options(num_cpus=1, memory=128 << 20)
        ray.get(raw_actor.ping.remote())
        fray_actor._fray_ready().result(timeout=60)

        def fray_job(i: int = 0) -> Any:
            return client.submit(JobRequest(name="noop", entrypoint=Entrypoint.from_callable(noop, args=(i,))))

        # Warm up both sides: worker processes, function exports, code paths.
        ray.get([raw_task.remote() for _ in range(50)])
        for job in [fray_job() for _ in range(50)]:
            job.wait()
        for _ in range(200):
            ray.get(raw_actor.ping.remote())
            fray_actor.ping()

        def raw_async_calls(n: int) -> None:
            ray.get([raw_actor.ping.remote(i) for i in range(n)])

        def fray_async_calls(n: int) -> None:
            futures = [fray_actor.ping.remote(i) for i in range(n)]
            for future in futures:
                future.result()

        def raw_async_tasks(n: int) -> None:
            ray.get([raw_task.remote(i) for i in range(n)])

        def fray_async_tasks(n: int) -> None:
            for job in [fray_job(i) for i in range(n)]:
                job.wait()

        def fray_wait_all_tasks(n: int) -> None:
            wait_all([fray_job(i) for i in range(n)])

        rows: dict[str, dict[str, list[float]]] = {}

        def add(row: str, side: str, value: float) -> None:
            rows.setdefault(row, {"raw": [], "fray": []})[side].append(value)

        def interleaved_latency(row: str, raw: Callable[[], Any], fray: Callable[[], Any], count: int) -> None:
            # raw and Fray calls alternate one by one, so both see the same machine load.
            samples: dict[str, list[float]] = {"raw": [], "fray": []}
            for _ in range(count):
                for side, call in (("raw", raw), ("fray", fray)):
                    start = time.perf_counter()
                    call()
                    samples[side].append(time.perf_counter() - start)
            for side, values in samples.items():
                add(f"{row} p50 (us)", side, percentile(values, 0.5) * 1e6)
                add(f"{row} p99 (us)", side, percentile(values, 0.99) * 1e6)

        for _ in range(args.rounds):
            interleaved_latency(
                "sync actor call", lambda: ray.get(raw_actor.ping.remote()), lambda: fray_actor.ping(), sync_calls
            )
            interleaved_latency("sync task", lambda: ray.get(raw_task.remote()), lambda: fray_job().wait(), sync_tasks)
            for side in ("raw", "fray"):
                batch = raw_async_calls if side == "raw" else fray_async_calls
                add(f"async actor calls, {async_calls} in flight (calls/s)", side, throughput(batch, async_calls))
                batch = raw_async_tasks if side == "raw" else fray_async_tasks
                add(f"tasks, {async_tasks} submitted then gathered (tasks/s)", side, throughput(batch, async_tasks))
                batch = raw_async_tasks if side == "raw" else fray_wait_all_tasks
                add(f"tasks, {async_tasks} submitted then wait_all (tasks/s)", side, throughput(batch, async_tasks))

        print(f"\nRay {ray.__version__}, {args.rounds} alternating rounds, medians over rounds\n")
        print(f"| {'measurement':<52} | {'raw Ray':>10} | {'Fray-on-Ray':>11} | {'Fray / raw':>10} |")
        print(f"| {'-' * 52} | {'-' * 10}: | {'-' * 11}: | {'-' * 10}: |")
        for row, sides in rows.items():
            raw, fray = statistics.median(sides["raw"]), statistics.median(sides["fray"])
            print(f"| {row:<52} | {raw:>10.0f} | {fray:>11.0f} | {fray / raw:>10.2f} |")
        print("\nLatency rows: a ratio above 1 is overhead. Throughput rows: a ratio below 1 is loss.")
    finally:
        client.shutdown(wait=False)
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
