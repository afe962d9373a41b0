"""The Fray -> Iris field mapping, checked on Iris's own types (no cluster needed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from iris.cluster.constraints import ConstraintOp, WellKnownAttribute
from iris.resources.state import JobState, TaskState
from iris.rpc import job_pb2

from fray import ConfigError, CpuConfig, EnvironmentConfig, GpuConfig, JobStatus, ResourceConfig, TpuConfig
from fray.core._remote import RemoteFailure
from fray.iris import _task
from fray.iris.job import _root_cause, _visible
from fray.iris.mapping import (
    ANY_REGION,
    JOB_STATES,
    TASK_STATES,
    convert_constraints,
    convert_container_profile,
    convert_environment,
    convert_resources,
    environment_spec,
    fray_status,
    group_coscheduling,
    iris_timeout,
    placement,
    resolve_coscheduling,
)


def test_every_iris_job_state_has_one_fray_status():
    assert set(JOB_STATES) == set(JobState)
    assert set(TASK_STATES) == set(TaskState)  # an actor-group member's status is its task's
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


# ----- marin's fields, honoured on Iris -----------------------------------------------------------


def test_a_choice_of_variants_of_one_kind_is_one_device_variant_constraint():
    resources = ResourceConfig(device_alternatives=[TpuConfig("v5litepod-16"), TpuConfig("v6e-16")])
    (variant,) = [c for c in convert_constraints(resources) if c.key == "device-variant"]
    assert variant.op == ConstraintOp.IN and [v.value for v in variant.values] == ["v5litepod-16", "v6e-16"]
    assert [
        c for c in convert_constraints(ResourceConfig(device=TpuConfig("v5p-8"))) if c.key == "device-variant"
    ] == []
    with pytest.raises(ConfigError, match="one kind of device"):
        convert_constraints(ResourceConfig(device_alternatives=[GpuConfig("H100", 8), CpuConfig()]))


def test_any_region_target_cluster_and_container_profile():
    (anywhere,) = convert_constraints(ResourceConfig(regions=[ANY_REGION]))
    assert anywhere.key == "region" and anywhere.op == ConstraintOp.EXISTS
    with pytest.raises(ConfigError, match="ANY_REGION cannot be combined"):
        convert_constraints(ResourceConfig(regions=[ANY_REGION, "us-central1"]))
    (cluster,) = convert_constraints(ResourceConfig(target_cluster="cw-us-east"))
    assert (cluster.key, cluster.op, cluster.values[0].value) == ("cluster", ConstraintOp.EQ, "cw-us-east")
    assert convert_container_profile(ResourceConfig()) == job_pb2.CONTAINER_PROFILE_UNSPECIFIED
    for name in ("privileged", "CONTAINER_PROFILE_PRIVILEGED"):
        assert convert_container_profile(ResourceConfig(container_profile=name)) == job_pb2.CONTAINER_PROFILE_PRIVILEGED
    with pytest.raises(ConfigError, match="sandbox"):
        convert_container_profile(ResourceConfig(container_profile="root"))


def test_a_timeout_is_irises_per_task_duration():
    from rigging.timing import Duration

    assert iris_timeout(None) is None
    assert iris_timeout(90) == Duration.from_seconds(90)
    assert iris_timeout(Duration.from_minutes(2)) == Duration.from_seconds(120)
    with pytest.raises(ConfigError, match="timeout"):
        iris_timeout(-1)


def test_gpu_gangs_and_gpu_actor_groups_are_coscheduled():
    h100 = ResourceConfig(device=GpuConfig("H100", 8))
    assert resolve_coscheduling(h100, 1) is None
    gang = resolve_coscheduling(h100, 2)
    assert gang is not None and gang.group_by == "leafgroup"
    group = group_coscheduling(ResourceConfig(device=GpuConfig("H100", 1)), 4)
    assert group is not None and group.group_by == "leafgroup"
    assert group_coscheduling(ResourceConfig(), 4) is None


def test_device_defaults_are_under_the_jobs_own_variables():
    spec, _ = environment_spec(
        EnvironmentConfig(), {"B": "2"}, workspace=None, in_task=False, device=TpuConfig("v5p-8")
    )
    assert spec.env_vars["JAX_PLATFORMS"] == "" and "LIBTPU_INIT_ARGS" in spec.env_vars and spec.env_vars["B"] == "2"
    spec, _ = environment_spec(
        EnvironmentConfig(), {"JAX_PLATFORMS": "tpu"}, workspace=None, in_task=False, device=CpuConfig()
    )
    assert spec.env_vars["JAX_PLATFORMS"] == "tpu"
    converted = convert_environment(EnvironmentConfig(env_vars={"A": "1"}, secrets={"S": "x"}), GpuConfig("H100"))
    assert converted is not None and converted.env_vars == {"JAX_PLATFORMS": "", "A": "1"}
    assert converted.secrets == {"S": "x"}
    assert converted.secret_behavior == "inherit"
    isolated = convert_environment(EnvironmentConfig(secrets={"S": "x"}, secret_behavior="isolate"))
    assert isolated is not None and isolated.secret_behavior == "isolate"
    assert convert_environment(None) is None


def test_extras_need_a_workspace_as_pip_packages_do():
    with pytest.raises(ConfigError, match="extras"):
        environment_spec(EnvironmentConfig(extras=["gpu"]), {}, workspace=None, in_task=False)
    spec, _ = environment_spec(
        EnvironmentConfig(extras=["gpu"], sync_packages=["tpu"]), {}, workspace="/ws", in_task=False
    )
    assert list(spec.extras or []) == ["gpu"] and list(spec.sync_packages or []) == ["tpu"]


def test_processes_per_task_needs_gpus_it_divides(monkeypatch):
    from iris.cluster.types import Entrypoint as IrisEntrypoint

    from fray.iris.entrypoints import NSYS_TASKS_ENV, check_processes_per_task, wrap_multiprocess, wrap_nsys

    with pytest.raises(ConfigError, match="processes_per_task=2"):
        check_processes_per_task(2, convert_resources(ResourceConfig()), "train")
    gpus = convert_resources(ResourceConfig(device=GpuConfig("H100", 8)))
    check_processes_per_task(4, gpus, "train")
    wrapped = wrap_multiprocess(IrisEntrypoint.from_command("python", "x.py"), gpus, 4)
    assert wrapped.command[:6] == ["python", "-m", "iris.jax.multigpu_main", "--nproc", "4", "--devices-per-proc"]
    fray_binary = IrisEntrypoint.from_command(*_task.binary_command(["python", "x.py"]))
    monkeypatch.delenv(NSYS_TASKS_ENV, raising=False)
    assert wrap_nsys(fray_binary).command == fray_binary.command
    monkeypatch.setenv(NSYS_TASKS_ENV, "all")
    assert wrap_nsys(fray_binary).command[:6] == ["$IRIS_PYTHON", "-m", "iris.hooks.nsys_main", "--tasks", "all", "--"]


def _failed_task(index: int, state: TaskState, finished_ms: int) -> Any:
    from iris.client.workload import TaskStatus
    from iris.cluster.types import JobName
    from rigging.timing import Timestamp

    return TaskStatus(
        task_id=JobName.from_wire(f"/root/gang/{index}"),
        state=state,
        worker_id="w",
        worker_address="",
        exit_code=1,
        error_message="",
        submitted_at=None,
        started_at=None,
        finished_at=Timestamp.from_ms(finished_ms),
        ports={},
        resource_usage=None,
        build_metrics=None,
        current_attempt_number=0,
        attempts=(),
        pending_reason="",
        can_be_scheduled=True,
        container_id="",
        backend_id="",
        execution_cluster_id="",
        status_message="",
    )


def test_a_gang_failure_blames_the_task_that_failed_not_the_sibling_killed_after_it():
    # Iris ends a failed task's siblings as COSCHED_FAILED, and a sibling's end is stamped when its worker
    # confirms the kill: often after the failure that caused it.
    culprit = _failed_task(1, TaskState.FAILED, finished_ms=1_000)
    sibling = _failed_task(0, TaskState.COSCHED_FAILED, finished_ms=1_050)
    assert _root_cause([sibling, culprit]) is culprit
    assert _root_cause([culprit, sibling]) is culprit
    # The latest of the tasks that failed by themselves (a later round's failure), and a sibling only when alone.
    later = _failed_task(0, TaskState.WORKER_FAILED, finished_ms=2_000)
    assert _root_cause([culprit, sibling, later]) is later
    assert _root_cause([sibling]) is sibling
