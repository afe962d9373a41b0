"""Bursts of trivial callable jobs on a local Fray cluster, with the CPU each kind of process spent per job.

    python benchmarks/cluster_burst.py                        # 1 warm-up job, 2 bursts of 100
    python benchmarks/cluster_burst.py --warmup 50 --bursts 6

Starts its own cluster (controller + 2 workers, free ports, a temp dir) and stops exactly it. Each burst
submits ``--jobs`` jobs and waits with ``fray.wait_all``; the CPU per job is read from ``/proc`` for every
process this run started (the controller, the workers, the fork servers with the task processes they reaped)
and for this process (the client). Compare two commits by running each commit's copy alternately: the
figures drift by a third between runs on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from fray import Entrypoint, JobRequest, wait_all
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster


def noop() -> None:
    """The job."""


def _cpu_by_kind(root: int) -> dict[str, float]:
    """CPU seconds (own and reaped children's) of every descendant of ``root``, by kind of process."""
    ticks = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline") as f:
                command = f.read().replace("\0", " ")
        except OSError:
            continue  # ended meanwhile
        utime, stime, cutime, cstime = map(int, fields[11:15])
        table[int(entry)] = (int(fields[1]), (utime + stime + cutime + cstime) / ticks, command)
    totals: dict[str, float] = {}
    stack = [root]
    while stack:
        parent = stack.pop()
        for pid, (ppid, cpu, command) in table.items():
            if ppid != parent:
                continue
            stack.append(pid)
            if "_forkserver" in command:
                kind = "fork server and tasks"
            elif " controller" in command:
                kind = "controller"
            elif " worker" in command:
                kind = "workers"
            else:
                kind = "other"
            totals[kind] = totals.get(kind, 0.0) + cpu
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmup", type=int, default=1, help="jobs run before the first burst")
    parser.add_argument("--bursts", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=100, help="jobs per burst")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fray-bench-burst-") as directory:
        cluster = LocalCluster(directory)
        cluster.start(2)
        client = ClusterClient(cluster.address, token=cluster.token)
        try:
            warm = [JobRequest(name=f"warm-{i}", entrypoint=Entrypoint.from_callable(noop)) for i in range(args.warmup)]
            wait_all([client.submit(request) for request in warm], timeout=600)
            for burst in range(args.bursts):
                before, mine, start = _cpu_by_kind(os.getpid()), os.times(), time.perf_counter()
                jobs = [
                    client.submit(JobRequest(name=f"b{burst}-{i}", entrypoint=Entrypoint.from_callable(noop)))
                    for i in range(args.jobs)
                ]
                wait_all(jobs, timeout=600)
                elapsed = time.perf_counter() - start
                after, mine_after = _cpu_by_kind(os.getpid()), os.times()
                client_ms = ((mine_after.user + mine_after.system) - (mine.user + mine.system)) / args.jobs * 1e3
                parts = [f"client {client_ms:.2f}"] + [
                    f"{kind} {(after[kind] - before.get(kind, 0.0)) / args.jobs * 1e3:.2f}" for kind in sorted(after)
                ]
                print(f"burst {burst}: {args.jobs / elapsed:.0f} jobs/s; CPU ms per job: " + ", ".join(parts))
        finally:
            client.shutdown(wait=False)
            cluster.stop()


if __name__ == "__main__":
    main()
