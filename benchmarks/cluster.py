"""The Fray cluster against Ray, measured in one run on this machine.

    python benchmarks/cluster.py            # Fray and Ray
    python benchmarks/cluster.py --no-ray   # Fray only

Prints one table: cluster start-up, trivial job submit -> SUCCEEDED, a burst of
trivial jobs, 8 actors created until all answer, and the idle memory of the cluster,
each next to Ray's figure from the same run and the ratio. Run it with nothing else
busy: the machine has 2 cores and the figures drift 20-50 % between runs anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

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


def bench_fray(jobs: int) -> dict[str, float]:
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
            group = client.create_actor_group(Echo, name="echo", count=8, resources=ResourceConfig(cpu=0))
            for handle in group.wait_ready(timeout=120):
                handle.ping()
            results["actors"] = time.perf_counter() - start
            group.shutdown()
            client.shutdown(wait=False)
        finally:
            cluster.stop()
    return results


def bench_ray(jobs: int) -> dict[str, float]:
    # Ray 2.60 clusters require a token, and Ray reads RAY_AUTH_MODE once, at import.
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    from ray.job_submission import JobStatus as RayJobStatus
    from ray.job_submission import JobSubmissionClient

    import ray

    results: dict[str, float] = {}
    env = dict(os.environ)
    start = time.perf_counter()
    subprocess.run(
        ["ray", "start", "--head", "--num-cpus", "2", "--include-dashboard", "true", "--disable-usage-stats"],
        check=True,
        capture_output=True,
        env=env,
    )
    results["start"] = time.perf_counter() - start
    try:
        time.sleep(1.0)
        ray_pids = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and any("ray" in part for part in p.info["cmdline"][:3]) and p.pid != os.getpid()
        ]
        results["rss"] = tree_rss(ray_pids)
        jobs_client = JobSubmissionClient("http://127.0.0.1:8265")

        def ray_job() -> None:
            job_id = jobs_client.submit_job(entrypoint=f"{sys.executable} -c 'print(1)'")
            while jobs_client.get_job_status(job_id) not in (RayJobStatus.SUCCEEDED, RayJobStatus.FAILED):
                time.sleep(0.01)

        results["job_binary"] = median_of(5, ray_job)
        ray_jobs = max(5, jobs // 10)
        start = time.perf_counter()
        ids = [jobs_client.submit_job(entrypoint=f"{sys.executable} -c 'print(1)'") for _ in range(ray_jobs)]
        for job_id in ids:
            while jobs_client.get_job_status(job_id) not in (RayJobStatus.SUCCEEDED, RayJobStatus.FAILED):
                time.sleep(0.01)
        results["burst"] = ray_jobs / (time.perf_counter() - start)
        results["burst_count"] = ray_jobs

        ray.init(address="auto", log_to_driver=False)
        remote_noop = ray.remote(noop)
        results["job_callable"] = median_of(15, lambda: ray.get(remote_noop.remote()))
        actor_cls = ray.remote(num_cpus=0)(Echo)
        start = time.perf_counter()
        actors = [actor_cls.remote() for _ in range(8)]
        ray.get([a.ping.remote() for a in actors])
        results["actors"] = time.perf_counter() - start
        ray.shutdown()
    finally:
        subprocess.run(["ray", "stop", "--force"], capture_output=True, env=env)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-ray", action="store_true", help="measure Fray only")
    parser.add_argument("--jobs", type=int, default=100, help="jobs in the burst (default 100)")
    args = parser.parse_args()
    fray_results = bench_fray(args.jobs)
    ray_results: dict[str, Any] = {} if args.no_ray else bench_ray(args.jobs)

    def ms(x: float) -> str:
        return f"{x * 1000:.1f} ms"

    rows = [
        ("cluster start-up (controller + 2 workers / ray start --head)", "start", lambda x: f"{x:.2f} s", "lower"),
        ("trivial callable job submit -> SUCCEEDED (Ray: task round trip)", "job_callable", ms, "lower"),
        ("trivial binary job submit -> SUCCEEDED (Ray: Ray Jobs)", "job_binary", ms, "lower"),
        (
            f"burst of trivial jobs, jobs/s (Fray {args.jobs} callables; Ray Jobs {ray_results.get('burst_count', '-')})",
            "burst",
            lambda x: f"{x:.1f}/s",
            "higher",
        ),
        ("8 actors created until all answer", "actors", lambda x: f"{x:.2f} s", "lower"),
        ("idle cluster memory (RSS of all its processes)", "rss", lambda x: f"{x / 2**20:.0f} MB", "lower"),
    ]
    table = Table(title="Fray cluster vs Ray, one run on this machine")
    for column in ("what", "Fray", "Ray", "Fray advantage"):
        table.add_column(column)
    for label, key, fmt, better in rows:
        ours = fray_results[key]
        theirs = ray_results.get(key)
        if theirs is None:
            table.add_row(label, fmt(ours), "-", "-")
            continue
        ratio = theirs / ours if better == "lower" else ours / theirs
        table.add_row(label, fmt(ours), fmt(theirs), f"{ratio:.1f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
