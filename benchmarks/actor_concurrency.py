"""Calls per second on one actor with ``max_concurrency=8`` whose method sleeps 1 ms, against a Ray actor.

Usage: ``python benchmarks/actor_concurrency.py [--calls 4000] [--rounds 3] [--no-ray] [--no-cluster]``

With eight calls at a time and 1 ms of sleep each, no actor can do better than
8,000 calls/s; what separates the backends is the cost of a call around that sleep.
Each peer gets the same driver: ``WINDOW`` calls in flight through ``.remote()``,
topped up as they complete, from this process. Measured, in this same run:

* Fray's Fray cluster (``fray://``, a controller and one worker started here),
* Fray's local backend (threads of this process),
* Fray's Ray backend (``RayClient``),
* a raw Ray actor (``@ray.remote(max_concurrency=8)``).

Printed: median calls/s over rounds, and each Fray row's ratio to raw Ray.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WINDOW = 64
CONCURRENCY = 8
SLEEP = 0.001


class Sleeper:
    """The measured actor: each call sleeps 1 ms, as an actor waiting on I/O would."""

    def nap(self) -> int:
        time.sleep(SLEEP)
        return 1


def drive(submit: Callable[[], Any], wait_one: Callable[[list[Any]], tuple[list[Any], list[Any]]], calls: int) -> float:
    """Calls/s for ``calls`` calls with ``WINDOW`` in flight; ``wait_one`` splits futures into (done, pending)."""
    started = time.perf_counter()
    pending: list[Any] = []
    sent = done = 0
    while done < calls:
        while sent < calls and len(pending) < WINDOW:
            pending.append(submit())
            sent += 1
        finished, pending = wait_one(pending)
        done += len(finished)
    return calls / (time.perf_counter() - started)


def _wait_futures(pending: list[Any]) -> tuple[list[Any], list[Any]]:
    done, rest = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
    for future in done:
        future.result()
    return list(done), list(rest)


def measure_fray(client: Any, label: str, calls: int, rounds: int) -> tuple[str, float]:
    from fray import ActorConfig

    name = "sleeper-" + "".join(c if c.isalnum() else "-" for c in label.lower())
    actor = client.create_actor(Sleeper, name=name, actor_config=ActorConfig(max_concurrency=CONCURRENCY))
    actor.nap()
    drive(actor.nap.remote, _wait_futures, min(calls, 500))  # warm up
    results = [drive(actor.nap.remote, _wait_futures, calls) for _ in range(rounds)]
    return label, statistics.median(results)


def measure_raw_ray(calls: int, rounds: int) -> tuple[str, float]:
    import ray

    actor = ray.remote(max_concurrency=CONCURRENCY, num_cpus=0)(Sleeper).remote()
    ray.get(actor.nap.remote())

    def wait_refs(pending: list[Any]) -> tuple[list[Any], list[Any]]:
        done, rest = ray.wait(pending, num_returns=1)
        ray.get(done)
        return done, rest

    drive(actor.nap.remote, wait_refs, min(calls, 500))
    results = [drive(actor.nap.remote, wait_refs, calls) for _ in range(rounds)]
    ray.kill(actor)
    return "raw Ray actor", statistics.median(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--no-cluster", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # workers import Sleeper from this module
    rows: list[tuple[str, float]] = []

    if not args.no_cluster:
        from fray.cluster.client import ClusterClient
        from fray.cluster.server.launcher import LocalCluster

        with tempfile.TemporaryDirectory() as tmp:
            cluster = LocalCluster(Path(tmp), env={"PYTHONPATH": str(Path(__file__).resolve().parent)})
            try:
                cluster.start_controller()
                cluster.add_worker("bench-0", "--cpu", "2")
                cluster.wait_for_workers(1)
                with ClusterClient(cluster.address, token=cluster.token) as client:
                    rows.append(measure_fray(client, "Fray cluster (fray://)", args.calls, args.rounds))
            finally:
                cluster.stop()

    from fray.local import LocalClient

    with LocalClient(echo_logs=False) as local:
        rows.append(measure_fray(local, "Fray local backend", args.calls, args.rounds))

    if not args.no_ray:
        import ray
        from fray.ray import RayClient

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            with RayClient(namespace="bench") as client:
                rows.append(measure_fray(client, "Fray Ray backend", args.calls, args.rounds))
            rows.append(measure_raw_ray(args.calls, args.rounds))
        finally:
            ray.shutdown()

    raw = dict(rows).get("raw Ray actor")
    print(f"\none actor, max_concurrency={CONCURRENCY}, {SLEEP * 1000:.0f} ms per call, {WINDOW} calls in flight")
    print(f"{'peer':<26} {'calls/s':>9} {'vs raw Ray':>11}")
    for label, rate in rows:
        ratio = f"{rate / raw:.2f}x" if raw else "-"
        print(f"{label:<26} {rate:>9.0f} {ratio:>11}")


if __name__ == "__main__":
    main()
