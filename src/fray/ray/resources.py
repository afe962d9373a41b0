"""Translate a :class:`~fray.resources.ResourceConfig` into Ray task and actor options.

Ray schedules on logical resources: ``num_cpus``, ``num_gpus``, ``memory`` (bytes) and
custom resources, plus node labels. The mapping is:

==========================  =====================================================
Fray                        Ray
==========================  =====================================================
``cpu``                     ``num_cpus``
``ram``                     ``memory`` (bytes)
``disk``                    not scheduled on (Ray has no disk resource)
``GpuConfig(type, count)``  ``num_gpus=count`` and ``accelerator_type=type``
                            unless ``type == "auto"``
``TpuConfig``               ``{"TPU": chips_per_host}`` per host (see ``tpu.py``)
``preemptible=False``       ``{"head_node": 0.0001}`` when the cluster advertises
                            the ``head_node`` resource, else Ray's built-in
                            ``node:__internal_head__`` marker
``regions``                 ``label_selector={"ray.io/availability-region": "in(...)"}``
``zone``                    ``label_selector={"ray.io/availability-zone": zone}``
``device_alternatives``     the first one the cluster has (:func:`choose_device`),
                            chosen when the work is submitted
==========================  =====================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fray.resources import DeviceConfig, GpuConfig, ResourceConfig, TpuConfig

__all__ = [
    "HEAD_NODE_RESOURCE",
    "RAY_HEAD_MARKER",
    "REGION_LABEL",
    "ZONE_LABEL",
    "choose_device",
    "head_node_resource",
    "ray_options",
]

HEAD_NODE_RESOURCE = "head_node"
"""The custom resource operators put on non-preemptible nodes (``ray start --resources='{"head_node": 1}'``)."""

RAY_HEAD_MARKER = "node:__internal_head__"
"""The resource Ray itself puts on the head node of every cluster."""

REGION_LABEL = "ray.io/availability-region"
"""The node label Ray sets from the cloud provider's region."""

ZONE_LABEL = "ray.io/availability-zone"
"""The node label Ray sets from the cloud provider's zone."""

# A tiny amount, so that any number of pinned tasks and actors fit on the head node:
# the resource only says *where*, never *how many*.
_PIN_AMOUNT = 0.0001


def head_node_resource(cluster_resources: dict[str, float]) -> str:
    """The resource name that pins work to non-preemptible nodes on this cluster."""
    if cluster_resources.get(HEAD_NODE_RESOURCE, 0) > 0:
        return HEAD_NODE_RESOURCE
    return RAY_HEAD_MARKER


def ray_options(resources: ResourceConfig, *, pin_resource: str = HEAD_NODE_RESOURCE) -> dict[str, Any]:
    """Ray ``.options(...)`` for one task or actor that needs ``resources``.

    TPU devices are not handled here: a TPU job is one task per host of a slice and
    is placed by :mod:`fray.ray.tpu`, which adds the ``TPU`` chips itself.
    """
    options: dict[str, Any] = {"num_cpus": resources.cpu}
    if resources.ram_bytes:
        options["memory"] = resources.ram_bytes
    custom: dict[str, float] = {}
    device = resources.device
    if isinstance(device, GpuConfig):
        options["num_gpus"] = device.count
        if device.type != "auto":
            options["accelerator_type"] = device.type
    elif isinstance(device, TpuConfig):
        custom["TPU"] = float(device.slice.chips_per_host)
    if not resources.preemptible:
        custom[pin_resource] = _PIN_AMOUNT
    if custom:
        options["resources"] = custom
    labels: dict[str, str] = {}
    regions = resources.placement_regions
    if regions:
        labels[REGION_LABEL] = f"in({','.join(regions)})"
    if resources.zone:
        labels[ZONE_LABEL] = resources.zone
    if labels:
        options["label_selector"] = labels
    return options


def choose_device(resources: ResourceConfig, cluster_resources: Mapping[str, float]) -> DeviceConfig:
    """The first of ``resources.device_choices`` that the cluster has at all (else the first: it waits for one).

    A GPU type shows as Ray's ``accelerator_type:<type>`` resource, a TPU slice as
    the ``TPU-<type>-head`` resource of its first host.
    """
    choices = resources.device_choices
    for device in choices:
        if isinstance(device, GpuConfig):
            typed = device.type == "auto" or f"accelerator_type:{device.type}" in cluster_resources
            if typed and cluster_resources.get("GPU", 0) >= device.count:
                return device
        elif isinstance(device, TpuConfig):
            if cluster_resources.get(f"TPU-{device.type}-head", 0) > 0:
                return device
        else:
            return device
    return choices[0]


def bundle(options: dict[str, Any]) -> dict[str, float]:
    """The placement-group bundle that holds exactly what a task with ``options`` asks for."""
    out: dict[str, float] = {}
    if options.get("num_cpus"):
        out["CPU"] = float(options["num_cpus"])
    if options.get("num_gpus"):
        out["GPU"] = float(options["num_gpus"])
    if options.get("memory"):
        out["memory"] = float(options["memory"])
    if options.get("accelerator_type"):
        out[f"accelerator_type:{options['accelerator_type']}"] = 0.001
    out.update(options.get("resources", {}))
    return out
