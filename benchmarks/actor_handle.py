"""A ``fray://`` actor handle against a direct ``ActorClient`` to the same actor, and a Ray actor, in one run.

    python benchmarks/actor_handle.py            # ~1-2 minutes
    python benchmarks/actor_handle.py --no-ray   # Fray only
    python benchmarks/actor_handle.py --quick    # fewer calls

What users call on a Fray cluster is the handle ``client.create_actor(...)`` returns; underneath,
once the actor serves, it is a ``fray.cluster.rpc.ActorClient``. This measures what the handle adds:
blocking calls (``handle.ping()``; the handle and the direct client alternate call by call, so
both see the same machine load) and ``.remote()`` with 64 calls in flight (rounds alternate).
Ray runs afterwards, on a local cluster of this run's own, with the same actor class.
Goals: handle p50 <= 1.5x the direct client's, >= 5x faster than Ray's; 64 in flight >= 10x Ray's.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

WINDOW = 64


class Echo:
    """The actor both sides call."""

    def ping(self, value: int = 0) -> int:
        return value


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def pipelined(remote: Callable[[int], Any], n: int) -> float:
    """Calls per second with ``WINDOW`` calls in flight."""
    start = time.perf_counter()
    window: list[Any] = []
    for i in range(n):
        window.append(remote(i))
        if len(window) >= WINDOW:
            window.pop(0).result()
    for future in window:
        future.result()
    return n / (time.perf_counter() - start)


def bench_fray(calls: int, rounds: int) -> dict[str, dict[str, float]]:
    from fray import ResourceConfig
    from fray.cluster.client import ClusterClient
    from fray.cluster.rpc import ActorClient, FixedResolver
    from fray.cluster.server.launcher import LocalCluster

    with tempfile.TemporaryDirectory() as directory:
        cluster = LocalCluster(directory)
        cluster.start(1)
        try:
            client = ClusterClient(cluster.address, token=cluster.token)
            handle = client.create_actor(Echo, name="echo", resources=ResourceConfig(cpu=0))
            handle._fray_ready().result(timeout=120)
            inner = handle._rpc  # the handle's own client: the same actor, URL and key
            assert inner is not None
            direct: ActorClient[Any] = ActorClient(
                FixedResolver({"echo": inner._channel.resolver.resolve("echo")[0]}, namespace=inner.namespace),
                "echo",
                token=inner._channel.token,
            )
            for _ in range(300):  # warm up both paths
                handle.ping()
                direct.ping()
            pipelined(handle.ping.remote, 1000)
            pipelined(direct.ping.remote, 1000)
            latency: dict[str, list[float]] = {"handle": [], "direct": []}
            rates: dict[str, list[float]] = {"handle": [], "direct": []}
            for _ in range(rounds):
                for _ in range(calls // rounds):
                    for side, call in (("handle", handle.ping), ("direct", direct.ping)):
                        start = time.perf_counter()
                        call()
                        latency[side].append(time.perf_counter() - start)
                rates["handle"].append(pipelined(handle.ping.remote, calls))
                rates["direct"].append(pipelined(direct.ping.remote, calls))
            direct.close()
            client.shutdown(wait=False)
        finally:
            cluster.stop()
    return {side: summary(latency[side], rates[side]) for side in ("handle", "direct")}


def bench_ray(calls: int, rounds: int) -> dict[str, float]:
    import ray

    temp_dir = tempfile.mkdtemp(prefix="fray-bench-ray-", dir="/tmp")
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        _temp_dir=temp_dir,
    )
    try:
        actor = ray.remote(num_cpus=0)(Echo).remote()
        for _ in range(300):
            ray.get(actor.ping.remote())
        latency: list[float] = []
        rates: list[float] = []

        class _Future:
            def __init__(self, ref: Any) -> None:
                self.ref = ref

            def result(self) -> Any:
                return ray.get(self.ref)

        for _ in range(rounds):
            for _ in range(calls // rounds):
                start = time.perf_counter()
                ray.get(actor.ping.remote())
                latency.append(time.perf_counter() - start)
            rates.append(pipelined(lambda i: _Future(actor.ping.remote(i)), calls))
        return summary(latency, rates)
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def summary(latency: list[float], rates: list[float]) -> dict[str, float]:
    return {
        "p50_us": percentile(latency, 0.5) * 1e6,
        "p99_us": percentile(latency, 0.99) * 1e6,
        "calls_per_s": statistics.median(rates),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray peer")
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke test)")
    args = parser.parse_args()
    calls, rounds = (1000, 3) if args.quick else (4000, 5)
    rows = bench_fray(calls, rounds)
    if not args.no_ray:
        rows["ray actor"] = bench_ray(calls // 2, rounds)
    print(f"\nActor calls, one run ({calls} blocking calls per side, {rounds} rounds)\n")
    print("| caller | sync p50 µs | sync p99 µs | calls/s, 64 in flight |")
    print("| --- | ---: | ---: | ---: |")
    names = {"handle": "fray:// actor handle", "direct": "fray.cluster.rpc ActorClient, same actor"}
    for key, row in rows.items():
        print(f"| {names.get(key, key)} | {row['p50_us']:.1f} | {row['p99_us']:.1f} | {row['calls_per_s']:,.0f} |")
    handle, direct = rows["handle"], rows["direct"]
    print(f"\nhandle p50 / direct p50            = {handle['p50_us'] / direct['p50_us']:.2f}x   (goal <= 1.5x)")
    print(f"handle calls/s / direct calls/s    = {handle['calls_per_s'] / direct['calls_per_s']:.2f}x")
    if "ray actor" in rows:
        ray_row = rows["ray actor"]
        print(f"ray p50 / handle p50               = {ray_row['p50_us'] / handle['p50_us']:.1f}x   (goal >= 5x)")
        print(
            f"handle calls/s / ray calls/s       = {handle['calls_per_s'] / ray_row['calls_per_s']:.1f}x   (goal >= 10x)"
        )


if __name__ == "__main__":
    main()
