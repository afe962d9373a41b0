"""The Fray -> Iris field mapping, checked on Iris's own types (no cluster needed)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from iris.cluster.constraints import ConstraintOp, WellKnownAttribute
from iris.resources.state import JobState
from iris.rpc import job_pb2

from fray import ConfigError, EnvironmentConfig, GpuConfig, JobStatus, ResourceConfig, TpuConfig
from fray.core._remote import RemoteFailure
from fray.iris import _task
from fray.iris.job import _visible
from fray.iris.mapping import JOB_STATES, environment_spec, fray_status, placement


def test_every_iris_job_state_has_one_fray_status():
    assert set(JOB_STATES) == set(JobState)
    assert fray_status("killed") == JobStatus.STOPPED
    assert fray_status(JobState.BUILDING) == JobStatus.RUNNING
    assert {fray_status(s) for s in ("failed", "worker_failed", "unschedulable")} == {JobStatus.FAILED}


def test_cpu_memory_and_disk_become_iris_resources():
    place = placement(ResourceConfig(cpu=0.5, ram="64m", disk="2g"), replicas=3)
    proto = place.resources.to_proto()
    assert (proto.cpu_millicores, proto.memory_bytes, proto.disk_bytes) == (500, 64 << 20, 2 << 30)
    assert not proto.HasField("device")
    assert place.replicas == 3 and place.hosts_per_replica == 1 and place.coscheduling is None
    assert place.constraints == []


def test_non_preemptible_is_a_hard_constraint_and_regions_restrict_placement():
    place = placement(ResourceConfig(preemptible=False, regions=["us-east1", "europe-west4"]), replicas=1)
    by_key = {c.key: c for c in place.constraints}
    preemptible = by_key[WellKnownAttribute.PREEMPTIBLE]
    assert preemptible.op == ConstraintOp.EQ and preemptible.mode == job_pb2.CONSTRAINT_MODE_REQUIRED
    assert str(preemptible.values[0].value).lower() == "false"
    region = by_key[WellKnownAttribute.REGION]
    assert region.op == ConstraintOp.IN and [v.value for v in region.values] == ["us-east1", "europe-west4"]


def test_a_zone_field_becomes_an_iris_zone_constraint():
    # ResourceConfig has no zone yet; the mapping picks one up as soon as it does.
    @dataclass(frozen=True)
    class Zoned(ResourceConfig):
        zone: str | None = None

    place = placement(Zoned(zone="us-central1-a"), replicas=1)
    assert [(c.key, c.values[0].value) for c in place.constraints] == [("zone", "us-central1-a")]


def test_gpus_and_tpu_slices_become_iris_devices():
    gpu = placement(ResourceConfig(device=GpuConfig("H100", 8)), replicas=2).resources.to_proto()
    assert (gpu.device.gpu.variant, gpu.device.gpu.count) == ("H100", 8)
    tpu = placement(ResourceConfig(device=TpuConfig("v5litepod-16")), replicas=2)
    assert tpu.resources.to_proto().device.tpu.variant == "v5litepod-16"
    assert (tpu.replicas, tpu.hosts_per_replica) == (8, 4)  # two slices of four hosts: one Iris task per host
    assert tpu.coscheduling is not None and tpu.coscheduling.group_by == "tpu-name"


def test_environment_maps_onto_iris_environment_and_image():
    env = EnvironmentConfig(docker_image="ghcr.io/me/img:1", env_vars={"A": "1"})
    spec, image = environment_spec(env, {"A": "1", "B": "2"}, workspace=None, in_task=False)
    assert image == "ghcr.io/me/img:1"
    assert spec.env_vars == {"A": "1", "B": "2"} and spec.setup_scripts == []
    spec, _ = environment_spec(EnvironmentConfig(pip_packages=["x"]), {}, workspace="/ws", in_task=False)
    assert spec.setup_scripts is None and list(spec.pip_packages or []) == ["x"]  # Iris's default setup runs


def test_environment_that_iris_cannot_honour_is_refused_by_name():
    with pytest.raises(ConfigError, match="pip_packages"):
        environment_spec(EnvironmentConfig(pip_packages=["x"]), {}, workspace=None, in_task=False)
    with pytest.raises(ConfigError, match="workspace"):
        environment_spec(EnvironmentConfig(workspace="/other"), {}, workspace="/ws", in_task=False)


def test_failure_line_round_trips_and_fray_lines_are_hidden_from_logs():
    try:
        raise KeyError("lost")
    except KeyError as exc:
        failure = RemoteFailure.capture(exc)
    line = _task.encode_failure_line(failure)
    assert _task.decode_failure_line(line) == failure
    assert _task.decode_failure_line("an ordinary line") is None
    assert _task.decode_failure_line(_task.FAILURE_TAG + "not base64!") is None
    assert _visible(line) == [] and _visible(_task.END_TAG) == []
    assert _visible("partial" + _task.END_TAG) == ["partial"] and _visible("plain") == ["plain"]


@pytest.mark.parametrize("task_id", ["/alice/job/0:0", "/alice/job/3:2", "/bob/root/child/grand/5", "/u/r/c/7:1"])
def test_task_identity_reads_the_environment_as_iris_does(monkeypatch, task_id):
    from iris.cluster.client import job_info

    monkeypatch.setenv("IRIS_TASK_ID", task_id)
    monkeypatch.setenv("IRIS_NUM_TASKS", "8")
    monkeypatch.setenv(_task.HOSTS_ENV, "2")
    monkeypatch.delenv("FRAY_JOB_NAME", raising=False)
    monkeypatch.delenv("FRAY_REPLICA_COUNT", raising=False)
    monkeypatch.setattr(job_info, "_job_info", job_info.ContextVar("job_info", default=None))
    iris_view = job_info.get_job_info()
    assert iris_view is not None
    mine = _task.identity()
    assert mine.job_id == iris_view.job_id.to_wire()
    assert mine.namespace == iris_view.job_id.namespace
    assert mine.name == iris_view.job_id.name
    assert (mine.replica_index, mine.attempt) == (iris_view.task_index // 2, iris_view.attempt_id)
    assert mine.replica_count == 4
