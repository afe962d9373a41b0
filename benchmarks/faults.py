"""What fault tolerance costs and how fast the cluster recovers, measured in one run on this machine.

    python benchmarks/faults.py                  # both tables
    python benchmarks/faults.py --jobs 500       # a longer throughput run
    python benchmarks/faults.py --base REF       # compare against another commit

1. Durability cost: trivial callable jobs through a fresh 2-worker cluster, this checkout
   against ``--base`` (default: the commit before issue 10's changes), alternating runs of
   the two in the same process tree, medians of ``--rounds``. The base runs from a
   temporary ``git worktree`` that is removed afterwards.
2. Recovery: a controller database holding ``--db-jobs`` finished jobs (default 10,000)
   and 100 queued ones; the controller is killed with SIGKILL mid-run and restarted.
   Reported: restart until it serves, until the first queued job finishes, until all do.

Everything runs on 127.0.0.1 with its own ports and temporary directories, and stops
only the processes it started.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASE = "c37023a"  # round 2's starting point, before exactly-once, fencing and the data-only protocol

# Runs inside a driver process whose PYTHONPATH selects the Fray under test (this checkout or the base).
_THROUGHPUT_DRIVER = r"""
import json, sys, tempfile, time
from pathlib import Path
from fray import Entrypoint, JobRequest, wait_all
from fray.cluster.client import ClusterClient
from fray.cluster.launcher import LocalCluster

def noop():
    pass

jobs = int(sys.argv[1])
with tempfile.TemporaryDirectory(prefix="fray-bench-faults-") as directory:
    with LocalCluster(Path(directory) / "cluster") as cluster:
        cluster.start(2, "--cpu", "4")
        client = ClusterClient(cluster.address, token=cluster.token)
        warm = [client.submit(JobRequest(name="warm", entrypoint=Entrypoint.from_callable(noop))) for _ in range(10)]
        wait_all(warm, timeout=300)
        started = time.perf_counter()
        handles = [client.submit(JobRequest(name=f"t{i}", entrypoint=Entrypoint.from_callable(noop))) for i in range(jobs)]
        wait_all(handles, timeout=600)
        elapsed = time.perf_counter() - started
print(json.dumps({"jobs": jobs, "seconds": elapsed}))
"""


def run_driver(src: Path, jobs: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    env.pop("FRAY_CLIENT_SPEC", None)
    out = subprocess.run(
        [sys.executable, "-c", _THROUGHPUT_DRIVER, str(jobs)], capture_output=True, text=True, env=env, timeout=1800
    )
    if out.returncode != 0:
        raise SystemExit(f"throughput driver failed (src={src}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(jobs / result["seconds"])


def durability_cost(base: str, jobs: int, rounds: int, console: Console) -> None:
    with tempfile.TemporaryDirectory(prefix="fray-bench-base-") as parent:
        base_tree = Path(parent) / "base"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(base_tree), base],
            check=True,
            capture_output=True,
        )
        try:
            rates: dict[str, list[float]] = {"base": [], "current": []}
            for _ in range(rounds):
                rates["base"].append(run_driver(base_tree / "src", jobs))
                rates["current"].append(run_driver(REPO / "src", jobs))
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)],
                check=False,
                capture_output=True,
            )
    old, new = statistics.median(rates["base"]), statistics.median(rates["current"])
    table = Table(title=f"Durability cost: {jobs} trivial callable jobs on 2 workers, median of {rounds}")
    for column in ("fray", "jobs/s", "runs", "vs base"):
        table.add_column(column)
    table.add_row(f"base ({base})", f"{old:.0f}", " ".join(f"{r:.0f}" for r in rates["base"]), "1.00x")
    table.add_row("this checkout", f"{new:.0f}", " ".join(f"{r:.0f}" for r in rates["current"]), f"{new / old:.2f}x")
    console.print(table)


def _prepare_db(path: Path, finished: int, queued: int) -> None:
    from fray.cluster._codec import spec_data
    from fray.cluster.messages import JobSpec
    from fray.cluster.store import ClusterStore
    from fray.job import Entrypoint, JobRequest
    from fray.rpc.datarpc import pack

    with ClusterStore(path) as store:
        now = time.time()
        spec = JobSpec.from_request(JobRequest(name="old", entrypoint=Entrypoint.from_binary("true")))
        request = pack(spec_data(spec))
        with store.batch():
            for _ in range(finished):
                job = store.submit_request(spec, request, user="bench", now=now, namespace="bench")
                store.terminate_job(job.job_id, now)
        queued_spec = JobSpec.from_request(JobRequest(name="queued", entrypoint=Entrypoint.from_binary("true")))
        with store.batch():
            for _ in range(queued):
                store.submit_request(
                    queued_spec, pack(spec_data(queued_spec)), user="bench", now=now, namespace="bench"
                )


def recovery(db_jobs: int, console: Console) -> None:
    from fray.cluster.controller_client import controller_client
    from fray.cluster.launcher import LocalCluster
    from fray.job import JobStatus

    queued = 100
    with tempfile.TemporaryDirectory(prefix="fray-bench-recover-") as directory:
        db = Path(directory) / "controller.db"
        started = time.perf_counter()
        _prepare_db(db, db_jobs, queued)
        prepared = time.perf_counter() - started
        with LocalCluster(Path(directory) / "cluster", db_path=db) as cluster:
            cluster.start_controller()
            control = controller_client(cluster.address, cluster.token)
            ids = [v.job_id for v in control.list_jobs(["pending"])]
            cluster.add_worker("w-a", "--cpu", "1")  # slow enough that the queue is still draining at the kill
            cluster.wait_for_workers(1)
            while sum(1 for v in control.list_jobs(["succeeded"])) < 5:
                time.sleep(0.01)
            cluster.kill_controller()
            killed = time.perf_counter()
            cluster.start_controller()
            serving = time.perf_counter() - killed
            first = all_done = None
            before = len(control.list_jobs(["succeeded"]))
            while all_done is None:
                done = len(control.list_jobs(["succeeded"]))
                if first is None and done > before:
                    first = time.perf_counter() - killed
                if done == queued:
                    all_done = time.perf_counter() - killed
                time.sleep(0.01)
            views = [control.job(i) for i in ids]
            assert all(v.state == JobStatus.SUCCEEDED for v in views)
            control.close()
    table = Table(
        title=f"Recovery after kill -9 of the controller, {db_jobs:,} finished + {queued} queued jobs in the DB"
    )
    table.add_column("step")
    table.add_column("seconds")
    table.add_row(f"(prepare the DB: {db_jobs + queued:,} jobs)", f"{prepared:.2f}")
    table.add_row("restart until serving", f"{serving:.2f}")
    table.add_row("restart until a queued job finishes", f"{first:.2f}")
    table.add_row(f"restart until all {queued} queued jobs finished", f"{all_done:.2f}")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=DEFAULT_BASE, help="commit to compare throughput against")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--db-jobs", type=int, default=10_000)
    parser.add_argument("--only", choices=["cost", "recovery"], default=None)
    args = parser.parse_args()
    console = Console()
    if args.only in (None, "recovery"):
        recovery(args.db_jobs, console)
    if args.only in (None, "cost"):
        durability_cost(args.base, args.jobs, args.rounds, console)


if __name__ == "__main__":
    main()
