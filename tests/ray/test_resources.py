"""ResourceConfig -> Ray options: a pure mapping, tested without a cluster."""

from __future__ import annotations

import pytest

from fray import GpuConfig, ResourceConfig, TpuConfig

pytest.importorskip("ray", reason='the Ray backend needs Ray: pip install "fray[ray]"')

from fray.ray.resources import (
    HEAD_NODE_RESOURCE,
    RAY_HEAD_MARKER,
    bundle,
    head_node_resource,
    ray_options,
)


def test_cpu_and_memory_map_to_num_cpus_and_memory_bytes() -> None:
    options = ray_options(ResourceConfig(cpu=2.5, ram="1g"))
    assert options == {"num_cpus": 2.5, "memory": 1 << 30}


def test_gpu_count_and_type() -> None:
    options = ray_options(ResourceConfig(device=GpuConfig("H100", 8)))
    assert options["num_gpus"] == 8
    assert options["accelerator_type"] == "H100"
    assert "accelerator_type" not in ray_options(ResourceConfig(device=GpuConfig("auto", 1)))


def test_tpu_asks_for_the_chips_of_one_host() -> None:
    options = ray_options(ResourceConfig(device=TpuConfig("v5litepod-16")))
    assert options["resources"] == {"TPU": 4.0}


def test_non_preemptible_pins_to_the_head_node_resource() -> None:
    pinned = ray_options(ResourceConfig(preemptible=False))
    assert pinned["resources"] == {HEAD_NODE_RESOURCE: pytest.approx(0.0001)}
    fallback = ray_options(ResourceConfig(preemptible=False), pin_resource=RAY_HEAD_MARKER)
    assert set(fallback["resources"]) == {RAY_HEAD_MARKER}
    assert "resources" not in ray_options(ResourceConfig())


def test_head_node_resource_prefers_the_convention_and_falls_back_to_rays_marker() -> None:
    assert head_node_resource({"CPU": 8.0, "head_node": 1.0, RAY_HEAD_MARKER: 1.0}) == HEAD_NODE_RESOURCE
    assert head_node_resource({"CPU": 8.0, RAY_HEAD_MARKER: 1.0}) == RAY_HEAD_MARKER


def test_regions_become_a_label_selector() -> None:
    options = ray_options(ResourceConfig(regions=["us-central1", "us-east5"]))
    assert options["label_selector"] == {"ray.io/availability-region": "in(us-central1,us-east5)"}


def test_bundle_holds_what_the_task_asks_for() -> None:
    options = ray_options(ResourceConfig(cpu=1, ram="256m", device=GpuConfig("A100", 2), preemptible=False))
    assert bundle(options) == {
        "CPU": 1.0,
        "GPU": 2.0,
        "memory": float(256 << 20),
        "accelerator_type:A100": 0.001,
        HEAD_NODE_RESOURCE: pytest.approx(0.0001),
    }
