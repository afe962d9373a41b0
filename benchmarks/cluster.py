"""The Fray cluster against Ray and Fray-on-Iris, measured in one run on this machine.

    python benchmarks/cluster.py                      # Fray, Ray and Iris, ~3 minutes (+1 to build the 3.12 venv once)
    python benchmarks/cluster.py --no-ray --no-iris   # Fray only

Prints one table: cluster start-up, trivial job submit -> SUCCEEDED, bursts of trivial
jobs, 8 actors created until all answer, one actor call (p50 of sequential calls), and
the idle memory of the cluster, each next to Ray's and Iris's figures from the same run
and the ratios. Like is compared with like: Fray's callable jobs with Ray *tasks*, Fray's
binary jobs with Ray *Jobs*. Then where a trivial Fray job's time goes, and the floor of
one process per job on this machine (``_isolation_floor.py``).

The Iris column is Fray on Iris (``fray.iris.client.IrisClient``): the same code, the same
``JobRequest``s and actor class as the Fray column, on a local Iris cluster of this run
(Iris's local mode: two workers with as many CPUs as Fray's two workers, tasks as
subprocesses). Iris needs Python >= 3.12, so that column runs this file with
``--iris-worker`` in a Python that has ``fray[iris]`` (``--iris-python``, else the test
suite's cached 3.12 venv of this checkout, built on first use; see
``benchmarks/_own_iris.py``) and reads back the JSON it prints. If Iris cannot run here,
the table says why in one line.

Safe on a shared machine: Ray and Iris run as clusters of this run's own (ports chosen
free, their own temp dirs), and only their processes are stopped, by PID (see
``benchmarks/_own_ray.py`` and ``benchmarks/_own_iris.py``); memory is the RSS of exactly
those processes. The figures drift 20-50 % between runs on a 2-core machine: read the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import psutil
from _isolation_floor import isolation_floor
from _own_iris import IrisUnavailable, OwnIris, iris_python, print_json, run_json, stop_on_sigterm
from _own_ray import OwnRay

from fray import Client, Entrypoint, JobRequest, ResourceConfig, wait_all
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster


@dataclass(frozen=True)
class Sizes:
    """How much each measurement does."""

    jobs: int = 100  # callable jobs (Ray: tasks) in the burst
    binary_jobs: int = 10  # binary jobs (Ray: Ray Jobs) in the burst
    runs: int = 15  # trivial jobs per median
    calls: int = 1000  # sequential actor calls per p50


def noop() -> None:
    pass


class Echo:
    def ping(self) -> str:
        return "pong"


def median_of(runs: int, fn: Callable[[], Any]) -> float:
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


def measure_client(client: Client, sizes: Sizes) -> dict[str, float]:
    """Jobs and actors through the Client API: the Fray column and the Iris column both run this."""
    results: dict[str, float] = {}
    # A fresh name per job: Iris replaces a finished job whose name is reused, which is not what is measured here.
    serial = itertools.count()
    results["job_callable"] = median_of(
        sizes.runs,
        lambda: client.submit(
            JobRequest(name=f"noop-{next(serial)}", entrypoint=Entrypoint.from_callable(noop))
        ).wait(),
    )
    results["job_binary"] = median_of(
        sizes.runs,
        lambda: client.submit(
            JobRequest(
                name=f"print-{next(serial)}", entrypoint=Entrypoint.from_binary(sys.executable, ["-c", "print(1)"])
            )
        ).wait(),
    )
    start = time.perf_counter()
    handles = [
        client.submit(JobRequest(name=f"burst-{i}", entrypoint=Entrypoint.from_callable(noop)))
        for i in range(sizes.jobs)
    ]
    wait_all(handles, timeout=600)
    results["burst"] = sizes.jobs / (time.perf_counter() - start)
    start = time.perf_counter()
    binaries = [
        client.submit(
            JobRequest(name=f"bin-{i}", entrypoint=Entrypoint.from_binary(sys.executable, ["-c", "print(1)"]))
        )
        for i in range(sizes.binary_jobs)
    ]
    wait_all(binaries, timeout=600)
    results["burst_binary"] = sizes.binary_jobs / (time.perf_counter() - start)
    start = time.perf_counter()
    group = client.create_actor_group(Echo, name="echo", count=8, resources=ResourceConfig(cpu=0))
    members = group.wait_ready(timeout=600)
    for handle in members:
        handle.ping()
    results["actors"] = time.perf_counter() - start
    results["actor_call"] = median_of(sizes.calls, members[0].ping)
    group.shutdown()
    return results


SPLIT = (
    ("submit -> assigned", "split_assign"),
    ("assigned -> exit recorded (the worker: start, run, exit, report)", "split_worker"),
    ("the client's own part", "split_client"),
)


def latency_split(client: ClusterClient) -> dict[str, float]:
    """Where a trivial callable job's submit -> SUCCEEDED goes, from the controller's own timestamps (medians).

    ``assigned`` is when the scheduling pass placed the task, ``exit recorded`` when the
    worker's report of its exit arrived (a task this short has its start in the same report:
    a start waits up to 20 ms for its exit); the client's part is the rest of the measured
    latency (the submit's and the wait's round trips).
    """
    parts: dict[str, list[float]] = {key: [] for _, key in SPLIT}
    for view in client._controller.list_jobs(None):
        if not view.name.startswith("noop-") or view.finished_at is None:
            continue
        task = client._controller.tasks(view.job_id)[0]
        if task.assigned_at is None or task.finished_at is None:
            continue
        parts["split_assign"].append(task.assigned_at - view.submitted_at)
        parts["split_worker"].append(task.finished_at - task.assigned_at)
    medians = {key: statistics.median(values) for key, values in parts.items() if values}
    return medians


def bench_fray(sizes: Sizes) -> dict[str, float]:
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
            results.update(measure_client(client, sizes))
            results.update(latency_split(client))
            client.shutdown(wait=False)
        finally:
            cluster.stop()
    return results


def bench_iris(sizes: Sizes) -> dict[str, float]:
    """Fray on a local Iris cluster of this run (needs Python >= 3.12 with ``fray[iris]``)."""
    from fray.iris.client import IrisClient

    results: dict[str, float] = {}
    # Two workers with the CPUs of Fray's two workers (each a worker of the machine's CPU count).
    with OwnIris(workers=2, cpus=os.cpu_count() or 1) as cluster:
        results["start"] = cluster.start_seconds
        time.sleep(1.0)  # let start-up settle before measuring idle memory
        results["rss"] = cluster.rss()
        client = IrisClient(cluster.address)
        try:
            results.update(measure_client(client, sizes))
        except Exception:
            print(f"the Iris cluster's log ends with:\n{cluster.log_tail()}", file=sys.stderr)
            raise
        finally:
            client.shutdown(wait=False)
    return results


def iris_column(python: str, sizes: Sizes) -> dict[str, float]:
    """The Iris column: this file run with ``--iris-worker`` by ``python``, which prints its figures as JSON."""
    args = [
        os.path.abspath(__file__),
        "--iris-worker",
        *(f"--{k.replace('_', '-')}={v}" for k, v in asdict(sizes).items()),
    ]
    return run_json(python, args, timeout=1800)


def bench_ray(sizes: Sizes) -> dict[str, float]:
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

        results["job_binary"] = median_of(min(5, sizes.runs), ray_job)
        start = time.perf_counter()
        ids = [jobs_client.submit_job(entrypoint=f"{sys.executable} -c 'print(1)'") for _ in range(sizes.binary_jobs)]
        for job_id in ids:
            finish(job_id)
        results["burst_binary"] = sizes.binary_jobs / (time.perf_counter() - start)

        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        try:
            remote_noop = ray.remote(noop)
            ray.get([remote_noop.remote() for _ in range(20)])  # warm up the worker pool
            results["job_callable"] = median_of(sizes.runs, lambda: ray.get(remote_noop.remote()))
            start = time.perf_counter()
            ray.get([remote_noop.remote() for _ in range(sizes.jobs)])
            results["burst"] = sizes.jobs / (time.perf_counter() - start)
            actor_cls = ray.remote(num_cpus=0)(Echo)
            start = time.perf_counter()
            actors = [actor_cls.remote() for _ in range(8)]
            ray.get([a.ping.remote() for a in actors])
            results["actors"] = time.perf_counter() - start
            results["actor_call"] = median_of(sizes.calls, lambda: ray.get(actors[0].ping.remote()))
        finally:
            ray.shutdown()
    finally:
        cluster.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-ray", action="store_true", help="leave out the Ray column")
    parser.add_argument("--no-iris", action="store_true", help="leave out the Iris column")
    parser.add_argument(
        "--iris-python",
        metavar="PYTHON",
        help="a Python >= 3.12 with fray[iris] for the Iris column "
        "(default: the test suite's cached 3.12 venv of this checkout, built if missing)",
    )
    parser.add_argument(
        "--jobs", type=int, default=Sizes.jobs, help="callable jobs / Ray tasks in the burst (default 100)"
    )
    parser.add_argument(
        "--binary-jobs", type=int, default=Sizes.binary_jobs, help="binary jobs / Ray Jobs in the burst (default 10)"
    )
    parser.add_argument(
        "--runs", type=int, default=Sizes.runs, help="trivial jobs per median (default 15; Ray Jobs: at most 5)"
    )
    parser.add_argument("--calls", type=int, default=Sizes.calls, help="sequential actor calls per p50 (default 1000)")
    parser.add_argument("--iris-worker", action="store_true", help=argparse.SUPPRESS)  # the Iris column's own run
    args = parser.parse_args()
    sizes = Sizes(args.jobs, args.binary_jobs, args.runs, args.calls)
    if args.iris_worker:
        stop_on_sigterm()  # a stopped run still stops its Iris cluster
        print_json(bench_iris(sizes))
        return

    # Find (or build) the Iris interpreter before measuring anything: a venv build would load the machine.
    python, iris_missing = None, "left out (--no-iris)"
    if not args.no_iris:
        try:
            python = iris_python(args.iris_python)
        except IrisUnavailable as exc:
            iris_missing = str(exc)
    # One engine at a time, each cluster stopped before the next starts: a running one keeps the cores busy.
    fray_results = bench_fray(sizes)
    ray_results: dict[str, Any] = {} if args.no_ray else bench_ray(sizes)
    iris_results: dict[str, Any] = {}
    if python is not None:
        try:
            iris_results = iris_column(python, sizes)
        except IrisUnavailable as exc:
            iris_missing = str(exc)
    print_table(sizes, fray_results, ray_results, iris_results, iris_missing if not iris_results else "")
    if "split_worker" in fray_results:
        known = sum(fray_results[key] for _, key in SPLIT[:2])
        fray_results["split_client"] = max(0.0, fray_results["job_callable"] - known)
        print(
            "Fray trivial callable job, where the time goes (medians): "
            + ", ".join(f"{label} {fray_results[key] * 1000:.1f} ms" for label, key in SPLIT)
        )
        floor = isolation_floor()
        print(
            f"Floor of a process per job on this machine (a fork of the fork server's modules, running nothing): "
            f"fork() {floor.fork_wall * 1000:.2f} ms (a spare takes it off a job's path), "
            f"exit -> reaped {floor.exit_wall * 1000:.2f} ms (a small task declares its exit before it), "
            f"{floor.cpu * 1000:.2f} ms CPU"
        )


def print_table(
    sizes: Sizes, fray: dict[str, float], ray: dict[str, float], iris: dict[str, float], iris_missing: str
) -> None:
    def ms(x: float) -> str:
        return f"{x * 1000:.1f} ms"

    def per_s(x: float) -> str:
        return f"{x:.1f}/s"

    def seconds(x: float) -> str:
        return f"{x:.2f} s"

    rows = [
        ("cluster start-up (Fray, Iris: controller + 2 workers; Ray: ray start --head)", "start", seconds, "lower"),
        ("trivial callable job submit -> SUCCEEDED (Ray: task round trip)", "job_callable", ms, "lower"),
        ("trivial binary job submit -> SUCCEEDED (Ray: Ray Jobs)", "job_binary", ms, "lower"),
        (f"burst of {sizes.jobs} callable jobs, jobs/s (Ray: {sizes.jobs} tasks)", "burst", per_s, "higher"),
        (f"burst of {sizes.binary_jobs} binary jobs, jobs/s (Ray: Ray Jobs)", "burst_binary", per_s, "higher"),
        ("8 actors created until all answer", "actors", seconds, "lower"),
        (f"actor call, p50 of {sizes.calls} sequential calls", "actor_call", lambda x: f"{x * 1000:.3f} ms", "lower"),
        ("idle cluster memory (RSS of all its processes)", "rss", lambda x: f"{x / 2**20:.0f} MB", "lower"),
    ]

    def versus(ours: float, theirs: float | None, fmt: Callable[[float], str], better: str) -> tuple[str, str]:
        if theirs is None:
            return "-", "-"
        ratio = theirs / ours if better == "lower" else ours / theirs
        return fmt(theirs), f"{ratio:.2f}x"

    print("\nFray cluster vs Ray and vs Fray-on-Iris, one run on this machine (vs > 1: the Fray cluster is better)\n")
    print(f"| {'what':<76} | {'Fray':>10} | {'Ray':>10} | {'vs Ray':>7} | {'Iris':>10} | {'vs Iris':>7} |")
    print(f"| {'-' * 76} | {'-' * 9}: | {'-' * 9}: | {'-' * 6}: | {'-' * 9}: | {'-' * 6}: |")
    for label, key, fmt, better in rows:
        ours = fray[key]
        ray_cell, ray_ratio = versus(ours, ray.get(key), fmt, better)
        iris_cell, iris_ratio = versus(ours, iris.get(key), fmt, better)
        print(
            f"| {label:<76} | {fmt(ours):>10} | {ray_cell:>10} | {ray_ratio:>7} | {iris_cell:>10} | {iris_ratio:>7} |"
        )
    if iris_missing:
        print(f"\nIris column not measured: {iris_missing}")


if __name__ == "__main__":
    main()
