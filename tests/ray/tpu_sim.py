"""A simulated TPU pod on a local multi-node Ray cluster, and the TPU scenarios Fray must pass on it.

This is a simulation: no TPU is involved. Several raylets run on this machine
(``ray.cluster_utils.Cluster``), and each one that stands for a TPU VM advertises
exactly what Ray's TPU accelerator manager makes a real TPU VM advertise:

* resources ``TPU: 4`` (chips per v4 host), ``{slice name}: 1`` on every host of a
  slice, ``TPU-v4-16-head: 1`` on host 0 of each slice, ``accelerator_type:TPU-V4: 1``;
* labels ``ray.io/tpu-slice-name``, ``ray.io/tpu-worker-id``, ``ray.io/tpu-pod-type``,
  ``ray.io/tpu-topology``.

Run as a script (``python tests/ray/tpu_sim.py OUTPUT.json``): it starts the cluster,
runs every scenario, writes what it observed as JSON and shuts the cluster down. The
pytest tests in ``test_tpu_simulation.py`` run it in a subprocess, because a process
holds one Ray connection and the test session already has its own cluster.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

POD_TYPE = "v4-16"  # 2 hosts of 4 chips each
HOSTS_PER_SLICE = 2
CHIPS_PER_HOST = 4


def tpu_host_args(slice_name: str, worker_id: int) -> dict[str, Any]:
    """The raylet arguments of one simulated TPU VM: what a real v4 host advertises."""
    resources: dict[str, float] = {"TPU": CHIPS_PER_HOST, slice_name: 1, "accelerator_type:TPU-V4": 1}
    if worker_id == 0:
        resources[f"TPU-{POD_TYPE}-head"] = 1
    labels = {
        "ray.io/tpu-slice-name": slice_name,
        "ray.io/tpu-worker-id": str(worker_id),
        "ray.io/tpu-pod-type": POD_TYPE,
        "ray.io/tpu-topology": "2x2x2",
    }
    return {"num_cpus": 1, "resources": resources, "labels": labels}


def record(path: str) -> None:
    """Job body: append what this process sees to ``path`` (one JSON line per process)."""
    import ray
    from fray import current_job

    info = current_job()
    assert info is not None
    line = {
        "node": ray.get_runtime_context().get_node_id(),
        "slice": os.environ.get("FRAY_TPU_SLICE_NAME"),
        "host": int(os.environ["FRAY_TPU_HOST_INDEX"]),
        "replica": info.replica_index,
        "replicas": info.replica_count,
        "attempt": info.attempt,
        "megascale": {k: v for k, v in os.environ.items() if k.startswith("MEGASCALE_")},
        "visible_tpu_chips": os.environ.get("TPU_VISIBLE_CHIPS"),
    }
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def record_node(path: str) -> None:
    """Job body: append the id of the node this runs on to ``path``."""
    import ray

    with open(path, "a") as f:
        f.write(json.dumps({"node": ray.get_runtime_context().get_node_id()}) + "\n")


class WhereAmI:
    """An actor that says which node it runs on."""

    def node(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())


def record_then_block_first_attempt(path: str) -> None:
    """Job body for preemption: record, then (first attempt only) run until the node is taken away."""
    record(path)
    from fray import current_job

    info = current_job()
    assert info is not None
    if info.attempt == 0:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # killed with its node long before this ends
            time.sleep(0.1)


def read_lines(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def progress(step: str) -> None:
    """Say on stderr how far the simulation got (the test shows it when the simulation fails)."""
    print(f"tpu-sim {time.strftime('%H:%M:%S')}: {step}", file=sys.stderr, flush=True)


def main(output: str) -> None:
    from ray.cluster_utils import Cluster

    import ray
    from fray import Entrypoint, JobFailed, JobRequest, ResourceConfig, TpuConfig
    from fray.ray import RayClient

    results: dict[str, Any] = {}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"head_node": 1}, "include_dashboard": False},
    )
    workdir = tempfile.mkdtemp(prefix="fray-tpu-sim-")
    client: RayClient | None = None
    try:
        nodes: dict[tuple[str, int], Any] = {}
        for slice_name in ("slice-a", "slice-b"):
            for worker in range(HOSTS_PER_SLICE):
                nodes[(slice_name, worker)] = cluster.add_node(**tpu_host_args(slice_name, worker))
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        node_slices = {
            n["NodeID"]: (
                (n.get("Labels") or {}).get("ray.io/tpu-slice-name"),
                (n.get("Labels") or {}).get("ray.io/tpu-worker-id"),
            )
            for n in ray.nodes()
        }
        results["node_slices"] = node_slices
        client = RayClient(namespace="tpu-sim")
        progress("connected")

        progress("scenario 0")
        # 0. preemptible=False pins actors and jobs to the node advertising "head_node".
        results["head_node"] = next(n["NodeID"] for n in ray.nodes() if "head_node" in n["Resources"])
        results["pin_resource"] = client._launcher.pin_resource()
        pinned = client.create_actor(WhereAmI, name="pinned", resources=ResourceConfig(cpu=0, preemptible=False))
        results["pinned_actor_node"] = pinned.node()
        path = os.path.join(workdir, "pinned.jsonl")
        entry = Entrypoint.from_callable(record_node, args=(path,))
        pinned_resources = ResourceConfig(cpu=0, preemptible=False)
        client.submit(JobRequest(name="pinned", entrypoint=entry, resources=pinned_resources)).wait(timeout=60)
        results["pinned_job_node"] = read_lines(path)[0]["node"]
        tpu = ResourceConfig(cpu=0.5, device=TpuConfig(POD_TYPE))

        def job(name: str, fn: Any, path: str, **kwargs: Any) -> Any:
            entry = Entrypoint.from_callable(fn, args=(path,))
            return client.submit(JobRequest(name=name, entrypoint=entry, resources=tpu, **kwargs))

        progress("scenario 1")
        # 1. One slice: one process per host, all on the hosts of one slice, host 0 on its head.
        path = os.path.join(workdir, "single.jsonl")
        results["single_status"] = str(job("single", record, path).wait(timeout=90))
        results["single"] = read_lines(path)

        progress("scenario 2")
        # 2. Multislice: replicas=2 takes both slices at once, with the MEGASCALE_* variables.
        path = os.path.join(workdir, "multi.jsonl")
        results["multi_status"] = str(job("multi", record, path, replicas=2).wait(timeout=90))
        results["multi"] = read_lines(path)

        progress("scenario 3")
        # 3. More slices than the pod has: stays PENDING (all or nothing), terminate releases them.
        path = os.path.join(workdir, "toomany.jsonl")
        toomany = job("toomany", record, path, replicas=3)
        results["toomany_status_before"] = str(toomany.status())
        toomany.terminate()
        results["toomany_status_after"] = str(toomany.wait(timeout=30, raise_on_failure=False))
        results["toomany_ran"] = read_lines(path)

        progress("scenario 4")
        # 4. A preempted slice is retried under max_retries_preemption, on a replacement VM.
        path = os.path.join(workdir, "preempt.jsonl")
        handle = job("preempt", record_then_block_first_attempt, path, max_retries_preemption=1)
        first = wait_for(lambda: len(read_lines(path)) == HOSTS_PER_SLICE and read_lines(path), 90, "attempt 0")
        victim_slice = first[0]["slice"]
        results["preempt_running_status"] = str(
            wait_for(lambda: str(handle.status()) == "running" and "running", 30, "RUNNING")
        )
        cluster.remove_node(nodes[(victim_slice, 0)], allow_graceful=False)
        nodes[(victim_slice, 0)] = cluster.add_node(**tpu_host_args(victim_slice, 0))
        results["preempt_status"] = str(handle.wait(timeout=120, raise_on_failure=False))
        results["preempt"] = read_lines(path)

        progress("scenario 5")
        # 5. With no preemption budget left, the loss of a host fails the job.
        path = os.path.join(workdir, "nobudget.jsonl")
        handle = job("nobudget", record_then_block_first_attempt, path, max_retries_preemption=0)
        first = wait_for(lambda: len(read_lines(path)) == HOSTS_PER_SLICE and read_lines(path), 90, "attempt 0")
        cluster.remove_node(nodes[(first[0]["slice"], 1)], allow_graceful=False)
        try:
            handle.wait(timeout=120)
            results["nobudget_error"] = None
        except JobFailed as exc:
            results["nobudget_error"] = str(exc)
        results["nobudget_status"] = str(handle.status())
        results["nobudget_ran"] = read_lines(path)
        progress("done")
    except BaseException:
        # Printed before Ray shuts down: a Ray call after ray.shutdown() (a Fray thread still at work)
        # ends the process at once, and the traceback would be lost.
        traceback.print_exc()
        sys.stderr.flush()
        raise
    finally:
        if client is not None:
            client.shutdown(wait=False)
        Path(output).write_text(json.dumps(results, indent=1))
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
