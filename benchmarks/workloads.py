"""The seeds' workloads, timed end to end: local, fray:// (own cluster), Ray via Fray, and raw Ray, in one run.

    python benchmarks/workloads.py              # ~4-6 minutes on 2 cores
    python benchmarks/workloads.py --rounds 1   # a smoke test

Two workloads, each as ``examples/`` runs it:

* **pipeline** -- ``examples/data_pipeline.py``: 1,000 records in 16 shard files, a group
  of 4 worker actors, a map stage and a reduce stage over shared storage (a temp dir),
  from writing the inputs to reading the outputs (actor start-up and shutdown included).
  Raw Ray: the same worker class as 4 ``ray.remote(num_cpus=0)`` actors, the same shard
  tasks sent round-robin, one ``ray.get`` per stage, ``ray.kill`` at the end.
* **inference** -- ``examples/inference_pool.py`` with a fixed pool of 4 servers
  (``min_workers = max_workers = 4``, so no scaling time is measured) answering 200
  requests of 5 ms "model" time each, through leased queues. Raw Ray: 4 ``ray.remote``
  tasks (1 CPU each, as Fray's server jobs) looping on a ``ray.util.queue.Queue`` of
  requests and putting results on another; Ray's queue has no leases, so raw Ray does
  less (a server killed mid-request loses its request there).

Every variant's output is checked against the local backend's before it is timed.
Each figure is the median of ``--rounds`` rounds after one warm-up round; Fray-on-Ray and
raw Ray alternate round by round on the same Ray. Safe on a shared machine: the Fray
cluster lives in a temp dir on ports of its own, Ray is a cluster of this run's own
(free ports, own temp dir, stopped by PID; see ``benchmarks/_own_ray.py``). Both offer 8
logical CPUs. Figures drift 20-50 % between runs on 2 cores: read the ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

# Ray 2.60 clusters require a token, and Ray reads RAY_AUTH_MODE once, at import.
os.environ["RAY_AUTH_MODE"] = "token"

import cloudpickle
from _own_ray import OwnRay

from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster
from fray.local import LocalClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
REQUESTS = 200
SERVICE_TIME = 0.005
CPUS = 8


def load_example(name: str) -> ModuleType:
    """Import ``examples/NAME.py`` and have both cloudpickles (Fray's and Ray's own copy) send it by value."""
    spec = importlib.util.spec_from_file_location(f"fray_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(module)
    return module


pipeline = load_example("data_pipeline")
inference = load_example("inference_pool")


def tag(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# ----- the workloads through Fray (the examples' own run()) -------------------------------------------


def fray_pipeline(client: Any, storage: str) -> Any:
    return pipeline.run(client, storage, name=tag("pipe")).totals


def fray_inference(client: Any, storage: str) -> Any:
    result = inference.run(
        client, name=tag("infer"), requests=REQUESTS, min_workers=4, max_workers=4, service_time=SERVICE_TIME
    )
    assert result.missing == () and result.duplicates == (), result
    return result.outputs


# ----- the same workloads written directly against Ray's API ----------------------------------------------


def raw_ray_pipeline(storage: str, records: int = 1000, shards: int = 16, partitions: int = 4, workers: int = 4) -> Any:
    import ray

    root = f"{storage}/{tag('raw-pipe')}"
    bounds = [records * s // shards for s in range(shards + 1)]
    data = pipeline.make_records(records)
    inputs = [f"{root}/input/shard-{s:05d}.jsonl" for s in range(shards)]
    for s, path in enumerate(inputs):
        pipeline.write_jsonl(path, data[bounds[s] : bounds[s + 1]])
    worker_cls = ray.remote(num_cpus=0)(pipeline.PipelineWorker)
    actors = [worker_cls.remote() for _ in range(workers)]
    try:
        ray.get([actor.__ray_ready__.remote() for actor in actors])
        map_tasks = [
            pipeline.ShardTask("map", s, (inputs[s],), f"{root}/map/shard-{s:05d}.jsonl") for s in range(shards)
        ]
        map_outputs = ray.get([actors[i % workers].run_shard.remote(t) for i, t in enumerate(map_tasks)])
        reduce_tasks = [
            pipeline.ShardTask("reduce", p, tuple(map_outputs), f"{root}/reduce/part-{p:05d}.jsonl", partitions)
            for p in range(partitions)
        ]
        outputs = ray.get([actors[i % workers].run_shard.remote(t) for i, t in enumerate(reduce_tasks)])
    finally:
        for actor in actors:
            ray.kill(actor)
    return tuple(sorted((r["key"], r["count"], r["sum"]) for path in outputs for r in pipeline.read_jsonl(path)))


def raw_server(requests: Any, results: Any, service_time: float) -> None:
    """A raw-Ray model server: take requests until a None, answer each."""
    while True:
        request = requests.get(block=True)
        if request is None:
            return
        time.sleep(service_time)
        results.put({"id": request["id"], "output": inference.model(request["prompt"])})


def raw_ray_inference(storage: str, servers: int = 4) -> Any:
    from ray.util.queue import Queue

    import ray

    requests, results = Queue(), Queue()
    try:
        server = ray.remote(num_cpus=1)(raw_server)
        running = [server.remote(requests, results, SERVICE_TIME) for _ in range(servers)]
        for i in range(REQUESTS):
            requests.put({"id": i, "prompt": f"prompt number {i}"})
        got = [results.get(block=True, timeout=300) for _ in range(REQUESTS)]
        for _ in range(servers):
            requests.put(None)
        ray.get(running)
    finally:
        requests.shutdown()
        results.shutdown()
    return tuple(sorted((r["id"], r["output"]) for r in got))


# ----- measuring ------------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any], expected: Any) -> float:
    start = time.perf_counter()
    got = fn()
    elapsed = time.perf_counter() - start
    assert got == expected, f"{fn} gave a different result"
    return elapsed


def measure(variants: dict[str, Callable[[], Any]], expected: Any, rounds: int) -> dict[str, float]:
    """One warm-up round, then ``rounds`` rounds alternating the variants; the median of each."""
    for fn in variants.values():
        timed(fn, expected)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(timed(fn, expected))
    return {name: statistics.median(values) for name, values in samples.items()}


WORKLOADS = {"pipeline": (fray_pipeline, raw_ray_pipeline), "inference": (fray_inference, raw_ray_inference)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per figure, after a warm-up (default 5)")
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {name: {} for name in WORKLOADS}
    expected: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="fray-bench-workloads-") as scratch:
        storage = f"{scratch}/storage"

        local = LocalClient()
        try:
            for name, (run_fray, _) in WORKLOADS.items():
                expected[name] = run_fray(local, storage)
                figures[name].update(
                    measure({"local": lambda f=run_fray: f(local, storage)}, expected[name], args.rounds)
                )
        finally:
            local.shutdown(wait=False)

        cluster = LocalCluster(f"{scratch}/cluster")
        try:
            cluster.start(2, "--cpu", str(CPUS // 2))
            client = ClusterClient(cluster.address, token=cluster.token)
            for name, (run_fray, _) in WORKLOADS.items():
                variants = {"fray": lambda f=run_fray: f(client, storage)}
                figures[name].update(measure(variants, expected[name], args.rounds))
            client.shutdown(wait=False)
        finally:
            cluster.stop()

        import ray
        from fray.ray import RayClient

        own_ray = OwnRay(num_cpus=CPUS).start()
        try:
            ray_client = RayClient(
                own_ray.address,
                namespace="bench-workloads",
                ray_init_kwargs={"log_to_driver": False, "configure_logging": False},
            )
            try:
                for name, (run_fray, run_raw) in WORKLOADS.items():
                    variants = {
                        "fray_on_ray": lambda f=run_fray: f(ray_client, storage),
                        "raw_ray": lambda f=run_raw: f(storage),
                    }
                    figures[name].update(measure(variants, expected[name], args.rounds))
            finally:
                ray_client.shutdown(wait=False)
                ray.shutdown()
        finally:
            own_ray.stop()

    print(f"\nWorkloads end to end, median of {args.rounds} rounds (lower is better; ratios against raw Ray)\n")
    print("| workload | local | fray:// | Fray on Ray | raw Ray | fray:// / raw Ray | Fray on Ray / raw Ray |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, f in figures.items():
        raw = f["raw_ray"]
        print(
            f"| {name} | {f['local']:.3f} s | {f['fray']:.3f} s | {f['fray_on_ray']:.3f} s | {raw:.3f} s "
            f"| {f['fray'] / raw:.2f}x | {f['fray_on_ray'] / raw:.2f}x |"
        )
    print(
        "\ngoals: pipeline fray:// <= 0.50x raw Ray; Fray on Ray <= 1.10x raw Ray."
        f" pipeline = 1,000 records x 16 shards, 4 actors; inference = {REQUESTS} requests x {SERVICE_TIME * 1000:.0f} ms,"
        " 4 servers"
    )


if __name__ == "__main__":
    main()
