"""What Fray adds on top of Iris: the same jobs and actors, raw Iris client vs Fray-on-Iris, in one run.

Run by hand; it starts its own local Iris cluster (Iris's local mode: controller and
workers in a child process, tasks as subprocesses, in a temp dir of this run) and stops
exactly its processes at the end (``benchmarks/_own_iris.py``). Iris needs Python >= 3.12:
run from an interpreter without ``fray[iris]``, the script re-runs itself in the test
suite's cached 3.12 venv of this checkout (built on first use)::

    python benchmarks/iris_backend.py            # ~3-5 minutes on 2 cores
    python benchmarks/iris_backend.py --quick    # smaller sizes, a smoke test

(Not ``benchmarks/iris.py``: run as a script, that name would shadow the ``iris`` package.)

Rows: a trivial job from submit to SUCCEEDED (median), a burst of jobs submitted at once
then waited for (jobs/s), 8 actors from creation until every one has answered a call,
and one actor call (p50 over sequential calls). Raw Iris does the same with Iris's own
client: ``IrisClient.submit`` + ``Job.wait``, and actor jobs serving an
``ActorServer`` registered in the endpoint registry, called through ``ActorClient``. Both
sides poll job state with the same backoff cap. Measurements alternate raw/Fray by
round and report medians; the ratio column is what matters on a noisy machine.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from _own_iris import OwnIris, run_under_iris_python, stop_on_sigterm

POLL = 0.25  # the state-poll backoff cap of both sides (fray.iris.job.POLL_INTERVAL)


class Echo:
    """The actor both sides call."""

    def ping(self, value: int = 0) -> int:
        return value


def noop() -> None:
    """The job both sides run."""


def serve_raw_echo(name: str) -> None:
    """A raw Iris actor job: serve Echo with Iris's actor server and register it (what seed 003 sketches)."""
    from iris.actor.server import ActorServer
    from iris.client.client import iris_ctx
    from iris.cluster.client import get_job_info

    ctx = iris_ctx()
    info = get_job_info()
    assert info is not None
    server = ActorServer(host=info.advertise_host, port=ctx.get_port("actor"))
    server.register(name, Echo())
    port = server.serve_background()
    ctx.registry.register(name, f"http://{info.advertise_host}:{port}")
    threading.Event().wait()


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--rounds", type=int, default=3, help="alternating raw/Fray rounds per measurement")
    args = parser.parse_args()
    run_under_iris_python()
    stop_on_sigterm()  # a stopped run still stops its Iris cluster
    burst, actors, calls = (20, 4, 200) if args.quick else (100, 8, 1000)

    from iris.actor.client import ActorClient
    from iris.client import IrisClient as IrisLib
    from iris.cluster.types import Entrypoint as IrisEntrypoint
    from iris.cluster.types import EnvironmentSpec, ResourceSpec

    import fray
    from fray import Entrypoint, JobRequest, ResourceConfig
    from fray.iris.client import IrisClient

    resources = ResourceConfig(cpu=0.1, ram="128m")
    raw_resources = ResourceSpec(cpu=0.1, memory="128m", disk="1g")
    raw_env = EnvironmentSpec(setup_scripts=[])

    with OwnIris(workers=2, cpus=64) as cluster:
        up = cluster.start_seconds
        raw = IrisLib.remote(cluster.url)
        client = IrisClient(cluster.address)

        def tag() -> str:
            return uuid.uuid4().hex[:6]

        def raw_job() -> float:
            start = time.perf_counter()
            job = raw.submit(IrisEntrypoint.from_callable(noop), f"raw-{tag()}", raw_resources, environment=raw_env)
            job.wait(timeout=300, poll_interval=POLL)
            return time.perf_counter() - start

        def fray_job() -> float:
            start = time.perf_counter()
            job = client.submit(JobRequest(f"fray-{tag()}", Entrypoint.from_callable(noop), resources))
            job.wait(timeout=300)
            return time.perf_counter() - start

        def raw_burst() -> float:
            start = time.perf_counter()
            jobs = [
                raw.submit(IrisEntrypoint.from_callable(noop), f"rb-{tag()}", raw_resources, environment=raw_env)
                for _ in range(burst)
            ]
            for job in jobs:
                job.wait(timeout=600, poll_interval=POLL)
            return burst / (time.perf_counter() - start)

        def fray_burst() -> float:
            start = time.perf_counter()
            jobs = [
                client.submit(JobRequest(f"fb-{tag()}", Entrypoint.from_callable(noop), resources))
                for _ in range(burst)
            ]
            fray.wait_all(jobs, timeout=600)
            return burst / (time.perf_counter() - start)

        def raw_actors() -> tuple[float, Any]:
            start = time.perf_counter()
            names = [f"ra-{tag()}" for _ in range(actors)]
            jobs = [
                raw.submit(
                    IrisEntrypoint.from_callable(serve_raw_echo, name),
                    name,
                    ResourceSpec(cpu=0.1, memory="128m", disk="1g"),
                    environment=raw_env,
                    ports=["actor"],
                )
                for name in names
            ]
            handles = []
            for job, name in zip(jobs, names, strict=True):
                resolver = raw.resolver_for_job(job.job_id)
                while resolver.resolve(name).is_empty:
                    time.sleep(0.02)
                handle = ActorClient(resolver, name)
                handle.ping(1)
                handles.append(handle)
            took = time.perf_counter() - start
            return took, (jobs, handles[0])

        def fray_actors() -> tuple[float, Any]:
            start = time.perf_counter()
            group = client.create_actor_group(Echo, name=f"fa-{tag()}", count=actors, resources=resources)
            handles = group.wait_ready(timeout=600)
            for handle in handles:
                handle.ping(1)
            took = time.perf_counter() - start
            return took, (group, handles[0])

        def call_p50(call: Callable[[], Any]) -> float:
            samples = []
            for _ in range(calls):
                start = time.perf_counter()
                call()
                samples.append(time.perf_counter() - start)
            return percentile(samples, 0.5)

        rows: dict[str, tuple[list[float], list[float]]] = {
            "trivial job, submit -> SUCCEEDED (s)": ([], []),
            f"{burst}-job burst (jobs/s)": ([], []),
            f"{actors} actors, create -> all answered (s)": ([], []),
            "actor call p50 (ms)": ([], []),
        }
        raw_job(), fray_job()  # warm both paths (imports, worker caches)
        for _ in range(args.rounds):
            rows["trivial job, submit -> SUCCEEDED (s)"][0].append(raw_job())
            rows["trivial job, submit -> SUCCEEDED (s)"][1].append(fray_job())
            rows[f"{burst}-job burst (jobs/s)"][0].append(raw_burst())
            rows[f"{burst}-job burst (jobs/s)"][1].append(fray_burst())
            took, (raw_jobs, raw_handle) = raw_actors()
            rows[f"{actors} actors, create -> all answered (s)"][0].append(took)
            took, (group, fray_handle) = fray_actors()
            rows[f"{actors} actors, create -> all answered (s)"][1].append(took)
            rows["actor call p50 (ms)"][0].append(1000 * call_p50(lambda h=raw_handle: h.ping(1)))
            rows["actor call p50 (ms)"][1].append(1000 * call_p50(lambda h=fray_handle: h.ping(1)))
            for job in raw_jobs:
                job.cancel()
            group.shutdown()
        client.shutdown(wait=False)

    print(f"\nlocal Iris cluster (2 workers) up in {up:.1f}s; {args.rounds} alternating rounds, medians\n")
    print(f"| {'measurement':<40} | {'raw Iris':>9} | {'Fray-on-Iris':>12} | {'Fray / raw':>10} |")
    print(f"| {'-' * 40} | {'-' * 9}: | {'-' * 12}: | {'-' * 10}: |")
    for name, (raw_samples, fray_samples) in rows.items():
        r, f = statistics.median(raw_samples), statistics.median(fray_samples)
        print(f"| {name:<40} | {r:>9.3g} | {f:>12.3g} | {f / r:>10.2f} |")
    print("\nTime rows: a ratio above 1 is overhead. The jobs/s row: a ratio below 1 is loss.")


if __name__ == "__main__":
    main()
