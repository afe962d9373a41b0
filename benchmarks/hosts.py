"""A Fray cluster across simulated hosts against the same cluster on one host, measured in one run.

    sudo python benchmarks/hosts.py                 # ~2 minutes; needs root and `ip` (network namespaces)
    sudo python benchmarks/hosts.py --jobs 500 --rounds 2

Across hosts: the controller on one simulated host (``tests/netns.py``: a network namespace on
a bridge) serving TLS, two workers on two more hosts that joined with a join token, and the
client here on the test machine, reaching the controller over TLS. On one host: the same
controller and two workers on 127.0.0.1 (plain, loopback). Both have two workers of 2 cores.
Reported, in rounds that alternate the two set-ups:

- job latency: a trivial callable job, submit -> SUCCEEDED (median of ``--runs``);
- throughput: ``--jobs`` trivial callable jobs submitted at once, until all succeeded;
- across hosts only: a worker host cut off (its link down) while it runs a job: the time until
  the controller lists the worker as lost (detection), and until the job's new attempt runs on
  the other host (rescheduling), with the worker timeout of the run (``--worker-timeout``).

Only this run's namespaces, bridge and processes are touched, and all are removed at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fray import Entrypoint, JobRequest, ResourceConfig, current_job, wait_all  # noqa: E402
from fray.cluster.client import ClusterClient  # noqa: E402
from fray.cluster.protocol.controller_client import controller_client  # noqa: E402
from fray.cluster.server.launcher import LocalCluster  # noqa: E402
from netns import Hosts, simulated_hosts  # noqa: E402


def noop() -> None:
    pass


def hold(directory: str) -> None:
    """Attempt 0 runs until killed; a later attempt marks that it started and ends."""
    info = current_job()
    assert info is not None
    Path(directory, f"attempt-{info.attempt}").write_text(str(time.time()))
    while info.attempt == 0:
        time.sleep(0.05)


def latency(client: ClusterClient, runs: int) -> float:
    times = []
    for i in range(runs):
        start = time.perf_counter()
        client.submit(JobRequest(name=f"lat-{i}", entrypoint=Entrypoint.from_callable(noop))).wait(timeout=60)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def throughput(client: ClusterClient, jobs: int) -> float:
    start = time.perf_counter()
    handles = client.submit_many(
        [
            JobRequest(name=f"burst-{i}", entrypoint=Entrypoint.from_callable(noop), resources=ResourceConfig(cpu=0.5))
            for i in range(jobs)
        ]
    )
    wait_all(handles, timeout=600)
    return jobs / (time.perf_counter() - start)


@contextmanager
def one_host(directory: Path, timeout: float) -> Iterator[ClusterClient]:
    with LocalCluster(directory, worker_timeout=timeout) as cluster:
        cluster.start(2, "--cpu", "2")
        client = ClusterClient(cluster.address, token=cluster.token)
        yield client
        client.shutdown(wait=False)


@contextmanager
def across_hosts(directory: Path, timeout: float, hosts: Hosts) -> Iterator[tuple[ClusterClient, Callable[[], None]]]:
    ctl_host, h1, h2 = hosts.add_lan(3)
    env = {"PYTHONPATH": str(REPO / "benchmarks")}  # the workers unpickle this file's functions by reference
    with LocalCluster(
        directory, worker_timeout=timeout, host=ctl_host.address, controller_prefix=ctl_host.prefix, env=env
    ) as cluster:
        cluster.start_controller()
        assert cluster.ca_file is not None
        os.environ["FRAY_TLS_CA"] = str(cluster.ca_file)
        token = cluster.create_token("worker")
        cluster.add_worker("w1", "--cpu", "2", prefix=h1.prefix, join=token)
        cluster.add_worker("w2", "--cpu", "2", prefix=h2.prefix, join=token)
        cluster.wait_for_workers(2, timeout=60)
        client = ClusterClient(cluster.address, token=cluster.token)

        def lose_a_host() -> None:
            measure_loss(cluster, client, {"w1": h1, "w2": h2}, hosts, directory)

        yield client, lose_a_host
        client.shutdown(wait=False)


LOSS: dict[str, list[float]] = {"detect": [], "reschedule": []}


def measure_loss(cluster: LocalCluster, client: ClusterClient, host_of: dict, hosts: Hosts, directory: Path) -> None:
    marks = Path(tempfile.mkdtemp(dir=directory))
    job = client.submit(
        JobRequest(
            name="held",
            entrypoint=Entrypoint.from_callable(hold, args=(str(marks),)),
            resources=ResourceConfig(cpu=2),
            max_retries_preemption=1,
        )
    )
    while not (marks / "attempt-0").exists():
        time.sleep(0.01)
    ctl = controller_client(cluster.address, cluster.token, ca=cluster.ca_file)
    worker_id = ctl.tasks(job.job_id)[0].worker_id
    assert worker_id is not None
    cut_at = time.time()
    hosts.cut(host_of[worker_id])
    lost_at = None
    while not (marks / "attempt-1").exists():
        if lost_at is None and any(w.info.worker_id == worker_id and not w.info.alive for w in ctl.list_workers()):
            lost_at = time.time()
        time.sleep(0.02)
    started = float((marks / "attempt-1").read_text())
    LOSS["detect"].append((lost_at or started) - cut_at)
    LOSS["reschedule"].append(started - cut_at)
    hosts.heal(host_of[worker_id])
    job.wait(timeout=60)
    cluster.wait_for_workers(2, timeout=60)
    ctl.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker-timeout", type=float, default=10.0)
    args = parser.parse_args()
    figures: dict[str, dict[str, list[float]]] = {
        "one host": {"latency": [], "throughput": []},
        "across hosts": {"latency": [], "throughput": []},
    }
    with tempfile.TemporaryDirectory() as tmp, simulated_hosts() as hosts:
        for r in range(args.rounds):
            with one_host(Path(tmp, f"one-{r}"), args.worker_timeout) as client:
                latency(client, 3)  # warm-up
                figures["one host"]["latency"].append(latency(client, args.runs))
                figures["one host"]["throughput"].append(throughput(client, args.jobs))
            with across_hosts(Path(tmp, f"hosts-{r}"), args.worker_timeout, hosts) as (client, lose_a_host):
                latency(client, 3)
                figures["across hosts"]["latency"].append(latency(client, args.runs))
                figures["across hosts"]["throughput"].append(throughput(client, args.jobs))
                lose_a_host()
            os.environ.pop("FRAY_TLS_CA", None)
    print(
        f"rounds: {args.rounds}; jobs: {args.jobs}; latency runs: {args.runs}; worker timeout {args.worker_timeout:g}s"
    )
    print(f"{'':14}{'job latency p50':>18}{'throughput':>16}")
    for name, values in figures.items():
        lat = statistics.median(values["latency"]) * 1000
        thr = statistics.median(values["throughput"])
        print(f"{name:14}{lat:15.1f} ms{thr:11.0f} jobs/s")
    one, across = figures["one host"], figures["across hosts"]
    lat_ratio = statistics.median(across["latency"]) / statistics.median(one["latency"])
    thr_ratio = statistics.median(across["throughput"]) / statistics.median(one["throughput"])
    print(f"across / one host: latency x{lat_ratio:.2f}, throughput x{thr_ratio:.2f}")
    print(
        f"host cut off: lost after {statistics.median(LOSS['detect']):.2f}s (each: "
        f"{', '.join(f'{x:.2f}' for x in LOSS['detect'])}), its job running again on the other host after "
        f"{statistics.median(LOSS['reschedule']):.2f}s (each: {', '.join(f'{x:.2f}' for x in LOSS['reschedule'])})"
    )


if __name__ == "__main__":
    main()
