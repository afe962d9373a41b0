"""Placement on every backend: a choice of acceptable devices, and zones beside regions."""

from __future__ import annotations

import pytest

from fray import (
    ConfigError,
    CpuConfig,
    Entrypoint,
    GpuConfig,
    JobRequest,
    JobStatus,
    ResourceConfig,
    TpuConfig,
    current_job,
)


def report_device(expected: str) -> None:
    info = current_job()
    assert info is not None
    assert info.device == expected, f"got device {info.device!r}, expected {expected!r}"


class DeviceReporter:
    def device(self) -> str:
        info = current_job()
        assert info is not None
        return info.device


def test_work_goes_to_an_alternative_the_backend_has(client, uid):
    # No backend in this suite has an H100: every one must fall back to the CPU choice, and say so.
    resources = ResourceConfig(cpu=0.5, device_alternatives=[GpuConfig("H100", 8), CpuConfig()])
    job = client.submit(
        JobRequest(
            name=f"choice-{uid}",
            entrypoint=Entrypoint.from_callable(report_device, args=("cpu",)),
            resources=resources,
        )
    )
    assert job.wait(timeout=300) == JobStatus.SUCCEEDED


def test_an_actor_reports_the_device_it_got(client, uid):
    resources = ResourceConfig(cpu=0, ram="0b", disk="0b", device_alternatives=[GpuConfig("H100"), CpuConfig()])
    actor = client.create_actor(DeviceReporter, name=f"dev-{uid}", resources=resources)
    assert actor.device() == "cpu"


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"device_alternatives": []}, "non-empty"),
        ({"device_alternatives": TpuConfig("v6e-8")}, "must be a list"),
        ({"device_alternatives": [TpuConfig("v6e-8"), TpuConfig("v6e-8")]}, "twice"),
        ({"device": TpuConfig("v5p-8"), "device_alternatives": [TpuConfig("v6e-8")]}, "only"),
        ({"zone": "us-central1-a", "regions": ["europe-west4"]}, "none of the regions"),
        ({"zone": "US Central"}, "zone name"),
    ],
)
def test_bad_placement_says_what_to_do(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        ResourceConfig(**kwargs)


def test_alternatives_make_the_first_one_the_device():
    resources = ResourceConfig(device_alternatives=[TpuConfig("v5litepod-16"), TpuConfig("v6e-16")])
    assert resources.device == TpuConfig("v5litepod-16")
    assert resources.device_choices == (TpuConfig("v5litepod-16"), TpuConfig("v6e-16"))
    assert resources.with_device(TpuConfig("v6e-16")).device_choices == (TpuConfig("v6e-16"),)
    assert ResourceConfig(zone="us-central1-a", regions=["us-central1"]).zone == "us-central1-a"
