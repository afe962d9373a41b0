"""The cluster controller under a backlog: throughput, CPU per job, memory, against Ray tasks in the same run.

    python benchmarks/controller.py                 # 2,000 queued jobs, both sizings, RSS after 10,000, and Ray
    python benchmarks/controller.py --no-ray
    python benchmarks/controller.py --sizing default --forms submit_many --rss-jobs 0 --no-ray   # the quick one
    python benchmarks/controller.py --profile out   # also a py-spy profile of the controller (out-*.txt)

Fray: a fresh controller and 2 workers on 127.0.0.1, in two sizings (``--sizing``): ``default``,
what ``fray cluster up --workers 2`` gives each worker (its share of this machine: on 2 cores one
core each, so 2 slots for 1-CPU jobs -- the small cluster with a deep queue, where each freed slot
used to cost a pass over the whole queue), and ``cpu8`` (``--worker-option "--cpu 8"``: 16 slots,
this benchmark's historical sizing). ``--jobs`` trivial callable jobs
submitted at once, then waited for, in the two forms users write: ``submit_many`` and the
plain loop ``[client.submit(r) for r in requests]`` (whose submits the client coalesces
into ``submit_many`` calls behind the caller's back). Reported for each: jobs/s from
the first submit to the last completion, the controller's CPU seconds per job, where all
the CPU of a job goes (this script, the controller, the workers, their fork servers and
the forked task processes: on a 2-core machine their sum bounds the rate at 2 s / sum),
and the controller's RSS before, after the burst and after ``--rss-jobs`` more jobs (flat
means no leak).
Ray: the same number of trivial tasks on a private local Ray (own temp dir, ``address=
"local"``, 2 CPUs), shut down afterwards, with the CPU of every process of that Ray per task.
Only processes this script started are stopped.
Last, the floor: the CPU an isolated process per job costs by itself on this machine (a fork
of a process with the fork server's modules, which exits at once; see ``_isolation_floor.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from _isolation_floor import isolation_floor
from rich.console import Console
from rich.table import Table

from fray import Entrypoint, JobRequest, wait_all
from fray.cli.cluster import _machine_share
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster


def noop() -> None:
    pass


FORMS = ("submit_many", "submit loop")


def burst(client: ClusterClient, count: int, name: str, form: str = "submit_many") -> tuple[float, float]:
    """Seconds from the first submit to the last completion, and to the last submit's return."""
    requests = [JobRequest(name=f"{name}{i}", entrypoint=Entrypoint.from_callable(noop)) for i in range(count)]
    started = time.perf_counter()
    handles = client.submit_many(requests) if form == "submit_many" else [client.submit(r) for r in requests]
    submitted = time.perf_counter() - started
    wait_all(handles, timeout=1800)
    return time.perf_counter() - started, submitted


#: The workers' options of each sizing (see the module's docstring).
SIZINGS = {
    "default": ("2 workers, default sizing", lambda: _machine_share(2, [])),
    "cpu8": ("2 workers, --cpu 8 each", lambda: ["--cpu", "8"]),
}


def slots(worker_args: list[str]) -> int:
    """How many 1-CPU jobs the two workers of this sizing run at once."""
    cpu = float(worker_args[worker_args.index("--cpu") + 1]) if "--cpu" in worker_args else os.cpu_count() or 1
    return 2 * int(cpu)


def fray_rows(
    jobs: int, rss_jobs: int, profile: str | None, worker_args: list[str], forms_run: tuple[str, ...] = FORMS
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="fray-bench-controller-") as directory,
        LocalCluster(Path(directory) / "cluster") as cluster,
    ):
        cluster.start(2, *worker_args)
        assert cluster.controller is not None
        controller = psutil.Process(cluster.controller.pid)
        client = ClusterClient(cluster.address, token=cluster.token)
        burst(client, 50, "warm")
        rss_before = controller.memory_info().rss
        forms: dict[str, dict[str, Any]] = {}
        for form in forms_run:
            cpu_before = sum(controller.cpu_times()[:2])
            roles_before = cpu_by_role(psutil.Process())
            spy = None
            if profile:
                spy = subprocess.Popen(
                    [
                        "py-spy",
                        "record",
                        "-o",
                        f"{profile}-{slots(worker_args)}slots-{form.replace(' ', '-')}.txt",
                        "-f",
                        "raw",
                        "-p",
                        str(controller.pid),
                        "-r",
                        "200",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            elapsed, submitted = burst(client, jobs, f"b{len(forms)}-", form)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            cpu = sum(controller.cpu_times()[:2]) - cpu_before
            roles = {
                role: 1000 * (t - roles_before.get(role, 0.0)) / jobs
                for role, t in cpu_by_role(psutil.Process()).items()
            }
            forms[form] = {
                "rate": jobs / elapsed,
                "submit_ms": 1000 * submitted / jobs,
                "cpu_ms": 1000 * cpu / jobs,
                "roles": roles,
            }
        rss_burst = controller.memory_info().rss
        done = 0
        while done < rss_jobs:
            burst(client, min(2000, rss_jobs - done), f"r{done}-")
            done += 2000
        rss_after = controller.memory_info().rss
        client.shutdown(wait=False)
    return {
        "forms": forms,
        "rss_before": rss_before / 2**20,
        "rss_burst": rss_burst / 2**20,
        "rss_after": rss_after / 2**20,
        "rss_jobs": rss_jobs,
    }


ROLES = ("driver", "controller", "workers", "fork servers", "tasks")


def cpu_by_role(driver: psutil.Process) -> dict[str, float]:
    """CPU seconds so far of this script and the cluster it started, by role.

    Tasks are the fork servers' children: their CPU is counted once they have been reaped.
    """
    times = {role: 0.0 for role in ROLES}
    times["driver"] = sum(driver.cpu_times()[:2])
    for proc in driver.children(recursive=True):
        try:
            argv, cpu = proc.cmdline(), proc.cpu_times()
        except psutil.Error:
            continue  # ended meanwhile
        if "fray.cluster.server.taskproc._forkserver" in argv:
            times["fork servers"] += cpu.user + cpu.system
            times["tasks"] += cpu.children_user + cpu.children_system
        elif "fray.cli" in argv and "controller" in argv:
            times["controller"] += cpu.user + cpu.system
        elif "fray.cli" in argv and "worker" in argv:
            times["workers"] += cpu.user + cpu.system
    return times


def tree_cpu(root: psutil.Process) -> float:
    """CPU seconds so far of ``root`` and every process under it."""
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            cpu = proc.cpu_times()
        except psutil.Error:
            continue  # ended meanwhile
        total += cpu.user + cpu.system
    return total


def ray_rate(jobs: int) -> tuple[float, float]:
    """Ray tasks per second, and the CPU milliseconds per task of this script and the Ray it started."""
    import ray

    with tempfile.TemporaryDirectory(prefix="fray-bench-ray-") as directory:
        ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=directory, log_to_driver=False)
        try:
            task = ray.remote(noop)
            ray.get([task.remote() for _ in range(50)])
            me = psutil.Process()
            cpu_before = tree_cpu(me)
            started = time.perf_counter()
            ray.get([task.remote() for _ in range(jobs)])
            elapsed = time.perf_counter() - started
            return jobs / elapsed, 1000 * (tree_cpu(me) - cpu_before) / jobs
        finally:
            ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rss-jobs", type=int, default=10_000)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--sizing", choices=(*SIZINGS, "both"), default="both")
    parser.add_argument("--forms", choices=(*FORMS, "both"), default="both")
    args = parser.parse_args()
    forms_run = FORMS if args.forms == "both" else (args.forms,)
    sizings = list(SIZINGS) if args.sizing == "both" else [args.sizing]
    runs: dict[str, dict[str, Any]] = {}
    for i, sizing in enumerate(sizings):
        worker_args = SIZINGS[sizing][1]()
        # The RSS rounds (a leak check, not a sizing question) run once, in the last sizing.
        rss_jobs = args.rss_jobs if i == len(sizings) - 1 else 0
        label = f"{SIZINGS[sizing][0]} ({slots(worker_args)} slots)"
        runs[label] = fray_rows(args.jobs, rss_jobs, args.profile, worker_args, forms_run)
    ray, ray_cpu = (None, None) if args.no_ray else ray_rate(args.jobs)
    floor = isolation_floor()
    table = Table(title=f"Controller under a backlog: {args.jobs} queued trivial callable jobs, 2 workers")
    for column in ("measure", "fray", "ray tasks", "fray / ray"):
        table.add_column(column)
    for label, fray in runs.items():
        table.add_section()
        table.add_row(label, "", "", "")
        for form, row in fray["forms"].items():
            table.add_row(
                f"jobs/s ({form})",
                f"{row['rate']:.0f}",
                "-" if ray is None else f"{ray:.0f}",
                "-" if ray is None else f"{row['rate'] / ray:.2f}x",
            )
        for form, row in fray["forms"].items():
            table.add_row(f"submit call, per job ({form})", f"{row['submit_ms']:.2f} ms", "", "")
        for form, row in fray["forms"].items():
            table.add_row(f"controller CPU per job ({form})", f"{row['cpu_ms']:.2f} ms", "", "")
        table.add_row(
            "controller RSS: warm / after burst", f"{fray['rss_before']:.0f} / {fray['rss_burst']:.0f} MiB", "", ""
        )
        if fray["rss_jobs"]:
            table.add_row(
                f"controller RSS after {fray['rss_jobs']:,} more jobs", f"{fray['rss_after']:.0f} MiB", "", ""
            )
    Console().print(table)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for label, fray in runs.items():
        for form, row in fray["forms"].items():
            roles = row["roles"]
            total = sum(roles.values())
            split = ", ".join(f"{role} {roles[role]:.2f}" for role in ROLES)
            print(
                f"CPU per job by process, {label}, {form} (ms): {split}; sum {total:.2f} ms "
                f"-> at most {cores / total * 1000:.0f} jobs/s on {cores} cores"
            )
    if ray_cpu is not None:
        print(
            f"Ray, CPU per task of the driver and every Ray process: {ray_cpu:.2f} ms (warm workers, no process per task)"
        )
    print(
        f"Floor of an isolated process per job on this machine: {floor.cpu * 1e3:.2f} ms CPU (fork and reap "
        f"{floor.parent_cpu * 1e3:.2f}, the child's own {floor.child_cpu * 1e3:.2f}) for a child that runs nothing"
    )


if __name__ == "__main__":
    main()
