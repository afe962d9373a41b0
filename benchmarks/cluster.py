"""The Fray cluster against Ray, measured in one run on this machine.

    python benchmarks/cluster.py            # Fray and Ray, ~2 minutes
    python benchmarks/cluster.py --no-ray   # Fray only

Prints one table: cluster start-up, trivial job submit -> SUCCEEDED, bursts of trivial
jobs, 8 actors created until all answer, and the idle memory of the cluster, each next
to Ray's figure from the same run and the ratio. Like is compared with like: Fray's
callable jobs with Ray *tasks*, Fray's binary jobs with Ray *Jobs*.

Safe on a shared machine: Ray runs as a cluster of this run's own (every port chosen
free, its own temp dir), and only the processes of that cluster are stopped, by PID
(see ``benchmarks/_own_ray.py``); its memory is the RSS of exactly those processes.
The figures drift 20-50 % between runs on a 2-core machine: read the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psutil
from _own_ray import OwnRay

from fray import Entrypoint, JobRequest, ResourceConfig, wait_all
from fray.cluster.client import ClusterClient
from fray.cluster.launcher import LocalCluster


def noop() -> None:
    pass


class Echo:
    def ping(self) -> str:
        return "pong"


def median_of(runs: int, fn: Callable[[], None]) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def tree_rss(pids: list[int]) -> int:
    """Resident memory of these processes and all their descendants, in bytes."""
    total = 0
    seen: set[int] = set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        for proc in [root, *root.children(recursive=True)]:
            if proc.pid in seen:
                continue
            seen.add(proc.pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                total += proc.memory_info().rss
    return total


def bench_fray(jobs: int, binary_jobs: int) -> dict[str, float]:
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as directory:
        cluster = LocalCluster(directory)
        start = time.perf_counter()
        cluster.start(2)
        results["start"] = time.perf_counter() - start
        try:
            client = ClusterClient(cluster.address, token=cluster.token)
            time.sleep(1.0)  # let start-up settle before measuring idle memory
            pids = [p.pid for p in [cluster.controller, *cluster.workers.values()] if p is not None]
            results["rss"] = tree_rss(pids)
            results["job_callable"] = median_of(
                15, lambda: client.submit(JobRequest(name="noop", entrypoint=Entrypoint.from_callable(noop))).wait()
            )
            results["job_binary"] = median_of(
                15,
                lambda: client.submit(
                    JobRequest(name="print", entrypoint=Entrypoint.from_binary(sys.executable, ["-c", "print(1)"]))
                ).wait(),
            )
            start = time.perf_counter()
            handles = [
                client.submit(JobRequest(name=f"burst-{i}", entrypoint=Entrypoint.from_callable(noop)))
                for i in range(jobs)
            ]
            wait_all(handles, timeout=600)
            results["burst"] = jobs / (time.perf_counter() - start)
            start = time.perf_counter()
            binaries = [
                client.submit(
                    JobRequest(name=f"bin-{i}", entrypoint=Entrypoint.from_binary(sys.executable, ["-c", "print(1)"]))
                )
                for i in range(binary_jobs)
            ]
            wait_all(binaries, timeout=600)
            results["burst_binary"] = binary_jobs / (time.perf_counter() - start)
            start = time.perf_counter()
            group = client.create_actor_group(Echo, name="echo", count=8, resources=ResourceConfig(cpu=0))
            for handle in group.wait_ready(timeout=120):
                handle.ping()
            results["actors"] = time.perf_counter() - start
            group.shutdown()
            client.shutdown(wait=False)
        finally:
            cluster.stop()
    return results


def bench_ray(jobs: int, binary_jobs: int) -> dict[str, float]:
    """Ray on a cluster of this run's own (free ports, own temp dir, stopped by PID; see _own_ray)."""
    # Ray 2.60 clusters require a token, and Ray reads RAY_AUTH_MODE once, at import.
    os.environ["RAY_AUTH_MODE"] = "token"
    from ray.job_submission import JobStatus as RayJobStatus
    from ray.job_submission import JobSubmissionClient

    import ray

    results: dict[str, float] = {}
    cluster = OwnRay(num_cpus=2)
    cluster.start()
    results["start"] = cluster.start_seconds
    try:
        time.sleep(1.0)  # let start-up settle before measuring idle memory
        results["rss"] = cluster.rss()
        jobs_client = JobSubmissionClient(cluster.dashboard_url)

        def finish(job_id: str) -> None:
            while jobs_client.get_job_status(job_id) not in (RayJobStatus.SUCCEEDED, RayJobStatus.FAILED):
                time.sleep(0.01)

        def ray_job() -> None:
            finish(jobs_client.submit_job(entrypoint=f"{sys.executable} -c 'print(1)'"))

        results["job_binary"] = median_of(5, ray_job)
        start = time.perf_counter()
        ids = [jobs_client.submit_job(entrypoint=f"{sys.executable} -c 'print(1)'") for _ in range(binary_jobs)]
        for job_id in ids:
            finish(job_id)
        results["burst_binary"] = binary_jobs / (time.perf_counter() - start)

        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        try:
            remote_noop = ray.remote(noop)
            ray.get([remote_noop.remote() for _ in range(20)])  # warm up the worker pool
            results["job_callable"] = median_of(15, lambda: ray.get(remote_noop.remote()))
            start = time.perf_counter()
            ray.get([remote_noop.remote() for _ in range(jobs)])
            results["burst"] = jobs / (time.perf_counter() - start)
            actor_cls = ray.remote(num_cpus=0)(Echo)
            start = time.perf_counter()
            actors = [actor_cls.remote() for _ in range(8)]
            ray.get([a.ping.remote() for a in actors])
            results["actors"] = time.perf_counter() - start
        finally:
            ray.shutdown()
    finally:
        cluster.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-ray", action="store_true", help="measure Fray only")
    parser.add_argument("--jobs", type=int, default=100, help="callable jobs / Ray tasks in the burst (default 100)")
    parser.add_argument("--binary-jobs", type=int, default=10, help="binary jobs / Ray Jobs in the burst (default 10)")
    args = parser.parse_args()
    # Fray first, then Ray: a running Ray cluster keeps both cores busy and would slow Fray down.
    fray_results = bench_fray(args.jobs, args.binary_jobs)
    ray_results: dict[str, Any] = {} if args.no_ray else bench_ray(args.jobs, args.binary_jobs)

    def ms(x: float) -> str:
        return f"{x * 1000:.1f} ms"

    def per_s(x: float) -> str:
        return f"{x:.1f}/s"

    rows = [
        ("cluster start-up (controller + 2 workers / ray start --head)", "start", lambda x: f"{x:.2f} s", "lower"),
        ("trivial callable job submit -> SUCCEEDED (Ray: task round trip)", "job_callable", ms, "lower"),
        ("trivial binary job submit -> SUCCEEDED (Ray: Ray Jobs)", "job_binary", ms, "lower"),
        (f"burst of {args.jobs} callable jobs, jobs/s (Ray: {args.jobs} tasks)", "burst", per_s, "higher"),
        (f"burst of {args.binary_jobs} binary jobs, jobs/s (Ray: Ray Jobs)", "burst_binary", per_s, "higher"),
        ("8 actors created until all answer", "actors", lambda x: f"{x:.2f} s", "lower"),
        ("idle cluster memory (RSS of all its processes)", "rss", lambda x: f"{x / 2**20:.0f} MB", "lower"),
    ]
    print("\nFray cluster vs Ray, one run on this machine (advantage > 1: Fray better)\n")
    print(f"| {'what':<66} | {'Fray':>10} | {'Ray':>10} | {'advantage':>9} |")
    print(f"| {'-' * 66} | {'-' * 9}: | {'-' * 9}: | {'-' * 8}: |")
    for label, key, fmt, better in rows:
        ours = fray_results[key]
        theirs = ray_results.get(key)
        if theirs is None:
            print(f"| {label:<66} | {fmt(ours):>10} | {'-':>10} | {'-':>9} |")
            continue
        ratio = theirs / ours if better == "lower" else ours / theirs
        print(f"| {label:<66} | {fmt(ours):>10} | {fmt(theirs):>10} | {ratio:>8.2f}x |")


if __name__ == "__main__":
    main()
