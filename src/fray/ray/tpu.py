"""TPU jobs on Ray: one process per host of a slice, gang-scheduled on the hosts of one slice.

What a Ray node on a TPU VM advertises (Ray's TPU accelerator manager sets it up):

* resource ``TPU``: the chips of this host (4 on v4/v5p hosts);
* resource ``TPU-{pod type}-head`` (e.g. ``TPU-v4-16-head``): 1, on worker 0 of each slice only;
* resource ``{slice name}``: 1 on every host of the slice;
* labels ``ray.io/tpu-slice-name``, ``ray.io/tpu-worker-id``, ``ray.io/tpu-pod-type``.

A :class:`TpuJob` attempt

1. reserves ``replicas`` slice heads at once with a placement group of
   ``TPU-{type}-head`` bundles (STRICT_SPREAD), which picks free slices atomically;
2. reads each head node's slice name and reserves every host of those slices with a
   second placement group of ``{slice name: 1, TPU: chips per host}`` bundles, so all
   processes of all slices start together or not at all;
3. runs the job once per host, with ``FRAY_REPLICA_INDEX`` = the slice index and, for
   multislice jobs, the ``MEGASCALE_*`` variables JAX uses to coordinate slices.

A lost host (a preempted slice) fails the attempt as a preemption: the placement
groups are released and the whole job is retried under ``max_retries_preemption``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from fray.core._lifecycle import Failure
from fray.core.inside._tpu_env import MEGASCALE_PORT, megascale_env, tpu_host_env
from fray.job import JobRequest
from fray.ray._launch import Launcher
from fray.ray.jobs import CallableJob
from fray.resources import TpuConfig

__all__ = ["MEGASCALE_PORT", "SLICE_NAME_LABEL", "WORKER_ID_LABEL", "TpuJob", "megascale_env"]

SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
WORKER_ID_LABEL = "ray.io/tpu-worker-id"
_WAIT_STEP = 0.5  # seconds between checks for terminate() while waiting for slices


class TpuJob(CallableJob):
    """A callable job on ``replicas`` whole TPU slices; see the module docstring.

    Only the placement of an attempt is its own: settling, retrying and stopping are
    the callable job's.
    """

    def __init__(self, launcher: Launcher, job_id: str, request: JobRequest, payload: tuple[bytes, bytes]) -> None:
        super().__init__(launcher, job_id, request, payload)
        device = request.resources.device
        assert isinstance(device, TpuConfig)
        self._tpu = device
        self._head_group: Any = None

    def _launch(self) -> None:
        # Waiting for slices can take as long as the cluster is busy: never on the caller's thread.
        threading.Thread(target=self._reserve_and_run, name=f"fray-tpu-{self._job_id}", daemon=True).start()

    def _wait_group(self, group: Any) -> bool:
        import ray

        ready = group.ready()
        while not self._stopping:
            done, _ = ray.wait([ready], timeout=_WAIT_STEP)
            if done:
                return True
        return False

    def _reserve_and_run(self) -> None:
        try:
            self._reserve_and_run_inner()
        except Exception as exc:  # a bug or a refused request must end the job, not hang it
            self._remove_placement_group()
            message = f"could not place the TPU job: {type(exc).__name__}: {exc}"
            self._lifecycle.fail(Failure.from_exception(exc).with_message(message))

    def _reserve_and_run_inner(self) -> None:
        from ray.util.placement_group import placement_group, placement_group_table
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        import ray

        request = self._request
        shape = self._tpu.slice
        slices = request.replicas
        head_resource = f"TPU-{self._tpu.type}-head"
        heads = placement_group([{head_resource: 1}] * slices, strategy="STRICT_SPREAD")
        with self._lock:
            self._head_group = heads
        if not self._wait_group(heads):
            return
        nodes = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
        head_nodes = [nodes[node_id] for node_id in _bundle_nodes(placement_group_table(heads))]
        slice_names = [_slice_name(node) for node in head_nodes]

        per_host: dict[str, float] = {"TPU": float(shape.chips_per_host)}
        if request.resources.cpu:
            per_host["CPU"] = float(request.resources.cpu)
        bundles = [{name: 1.0, **per_host} for name in slice_names for _ in range(shape.hosts)]
        hosts = placement_group(bundles, strategy="STRICT_SPREAD")
        with self._lock:
            self._placement_group = hosts
        if not self._wait_group(hosts):
            return
        bundle_nodes = _bundle_nodes(placement_group_table(hosts))

        # Host 0 of each slice is its head node; the others follow their TPU worker ids.
        order: list[tuple[int, int, int]] = []  # (slice, host, bundle index)
        for k, head in enumerate(head_nodes):
            indices = list(range(k * shape.hosts, (k + 1) * shape.hosts))
            indices.sort(key=lambda i: (bundle_nodes[i] != head["NodeID"], _worker_id(nodes.get(bundle_nodes[i]))))
            order += [(k, h, i) for h, i in enumerate(indices)]
        coordinator = str(head_nodes[0]["NodeManagerAddress"])

        options = {
            "num_cpus": request.resources.cpu,
            "resources": {"TPU": float(shape.chips_per_host)},
            "name": request.name,
        }
        remote = self._launcher.replica_fn()
        refs = []
        for process, (k, h, i) in enumerate(order):
            tpu_env = tpu_host_env(
                slice_names[k], h, shape.hosts, slice_id=k, num_slices=slices, coordinator_ip=coordinator
            )
            tpu_env["FRAY_TPU_NODE_ID"] = bundle_nodes[i]
            strategy = PlacementGroupSchedulingStrategy(hosts, placement_group_bundle_index=i)
            arguments = self._replica_arguments(process, self._replica_env(k, slices, tpu_env))
            refs.append(remote.options(**options, scheduling_strategy=strategy).remote(*arguments))
        self._start_attempt(refs)  # cancels them at once if terminate() came meanwhile

    def _remove_placement_group(self) -> None:
        with self._lock:
            heads, self._head_group = self._head_group, None
        super()._remove_placement_group()
        if heads is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(heads)

    def terminate(self) -> None:
        """Stop every host process and release the reserved slices."""
        with self._lock:
            self._stopping = True
        super().terminate()
        self._remove_placement_group()


def _bundle_nodes(table: dict[str, Any]) -> list[str]:
    mapping = table["bundles_to_node_id"]
    return [str(mapping[i]) for i in range(len(mapping))]


def _slice_name(node: dict[str, Any]) -> str:
    labels = node.get("Labels") or {}
    name = labels.get(SLICE_NAME_LABEL)
    if not name:
        raise RuntimeError(
            f"TPU slice head node {node.get('NodeManagerAddress')} has no {SLICE_NAME_LABEL!r} label; Ray sets it "
            "on TPU VMs (and the simulated cluster in Fray's tests sets it by hand)"
        )
    return str(name)


def _worker_id(node: dict[str, Any] | None) -> int:
    labels = (node or {}).get("Labels") or {}
    with contextlib.suppress(ValueError, TypeError):
        return int(labels.get(WORKER_ID_LABEL, 0))
    return 0
