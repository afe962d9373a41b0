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
3. Flood: a legitimate client's call latency (p50, p99) on the controller's data-only RPC
   server, idle and while 1,000 connections trickle bytes without finishing a handshake
   and another thread connects and drops as fast as it can.

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
from fray.cluster.server.launcher import LocalCluster

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
    from fray.cluster.protocol._codec import spec_data
    from fray.cluster.protocol.messages import JobSpec
    from fray.cluster.rpc.datarpc import pack
    from fray.cluster.server.store import ClusterStore
    from fray.job import Entrypoint, JobRequest

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
    from fray.cluster.protocol.controller_client import controller_client
    from fray.cluster.server.launcher import LocalCluster
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


def _latencies(address: str, token: bytes, calls: int) -> list[float]:
    from fray.cluster.rpc.datarpc import DataClient

    client = DataClient(address, token)
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        client.call("ping", [], {})
        samples.append(time.perf_counter() - started)
    return sorted(samples)


def flood(console: Console, calls: int = 2000) -> None:
    """Legitimate calls' latency, idle and under a handshake-trickle and connect flood."""
    import resource
    import socket
    import threading

    from fray.cluster.rpc.datarpc import DataServer

    token = b"k" * 32
    server = DataServer(lambda principal, method, args, kwargs: "pong", keys=token).start()
    host, port = server.address.rsplit(":", 1)
    stop = threading.Event()
    attackers: list[socket.socket] = []

    def trickle() -> None:
        while not stop.is_set() and len(attackers) < 1000:
            try:
                attackers.append(socket.create_connection((host, int(port)), timeout=5))
            except OSError:
                stop.wait(0.01)
        while not stop.wait(1.0):
            for sock in list(attackers):
                try:
                    sock.send(b"F")
                except OSError:
                    attackers.remove(sock)

    def connect_and_drop() -> None:
        while not stop.is_set():
            try:
                socket.create_connection((host, int(port)), timeout=5).close()
            except OSError:
                stop.wait(0.01)

    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(old[1], 8192), old[1]))
    try:
        idle = _latencies(server.address, token, calls)
        threads = [threading.Thread(target=f, daemon=True) for f in (trickle, connect_and_drop)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 120
        while len(attackers) < 1000 and time.monotonic() < deadline:
            stop.wait(0.1)
        attacked = _latencies(server.address, token, calls)
    finally:
        stop.set()
        for sock in attackers:
            sock.close()
        server.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, old)
    table = Table(title=f"Flood: {calls} legitimate calls, idle vs {len(attackers)} trickling connections + a flood")
    for column in ("", "p50", "p99", "p99 / idle p99"):
        table.add_column(column, justify="right")
    for label, samples in (("idle", idle), ("under attack", attacked)):
        p50, p99 = samples[len(samples) // 2], samples[int(len(samples) * 0.99) - 1]
        table.add_row(
            label, f"{p50 * 1e3:.2f} ms", f"{p99 * 1e3:.2f} ms", f"{p99 / idle[int(len(idle) * 0.99) - 1]:.1f}x"
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=DEFAULT_BASE, help="commit to compare throughput against")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--db-jobs", type=int, default=10_000)
    parser.add_argument("--only", choices=["cost", "recovery", "flood"], default=None)
    args = parser.parse_args()
    console = Console()
    if args.only in (None, "recovery"):
        recovery(args.db_jobs, console)
    if args.only in (None, "flood"):
        flood(console)
    if args.only in (None, "cost"):
        durability_cost(args.base, args.jobs, args.rounds, console)


if __name__ == "__main__":
    main()
