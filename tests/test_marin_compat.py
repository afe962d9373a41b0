"""marin's published fray API (``marin-fray`` 0.2.227) as a drop-in: its module paths and names over Fray's types.

Written as marin's users write their code; ``docs/marin.md`` lists each name and what differs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest

import fray
from fray.errors import ConfigError
from marin_on_fray.marin_venv import (
    INSTALL_TIMEOUT,
    SUITE_TIMEOUT,
    VenvBuildError,
    ensure_marin_venv,
    find_python312,
    marin_fray_dir,
)

MARIN_MODULES = {
    "fray.types": [
        "ResourceConfig", "CpuConfig", "GpuConfig", "TpuConfig", "EnvironmentConfig", "Entrypoint", "JobRequest",
        "JobStatus", "ActorConfig", "create_environment", "ANY_REGION", "tpu_family", "tpu_hbm_capacity_bytes",
        "tpu_hbm_bytes_per_chip", "get_tpu_topology", "TpuTopologyInfo",
    ],
    "fray.client": ["Client", "JobHandle", "JobStatus", "JobAlreadyExists", "JobFailed", "wait_all"],
    "fray.current_client": ["current_client", "set_current_client", "_current_client_var"],
    "fray.local_backend": ["LocalClient", "LocalJobHandle"],
    "fray.actor": ["ActorHandle", "ActorUnavailableError", "current_actor"],
    "fray.cluster": ["ResourceConfig"],
    "fray.device_flops": ["device_flops_for_jax_device"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(MARIN_MODULES))
def test_every_marin_module_path_imports_with_its_names(module: str) -> None:
    loaded = importlib.import_module(module)
    missing = [name for name in MARIN_MODULES[module] if not hasattr(loaded, name)]
    assert not missing, f"{module} lacks {missing}"


def test_one_type_per_concept() -> None:
    import fray.client
    import fray.cluster
    import fray.local
    import fray.local_backend
    import fray.types

    for name in ("ResourceConfig", "CpuConfig", "GpuConfig", "TpuConfig", "EnvironmentConfig", "JobRequest"):
        assert getattr(fray.types, name) is getattr(fray, name)
    assert fray.types.JobStatus is fray.client.JobStatus is fray.JobStatus
    assert fray.types.ActorConfig is fray.ActorConfig
    assert fray.cluster.ResourceConfig is fray.ResourceConfig
    assert fray.client.JobAlreadyExists is fray.JobAlreadyExists and fray.client.JobFailed is fray.JobFailed
    assert fray.local_backend.LocalClient is fray.local.LocalClient
    assert fray.local_backend.LocalJobHandle is fray.local.LocalJobHandle
    assert fray.types.TpuTopologyInfo is fray.TpuTopology


def test_iris_backend_path() -> None:
    pytest.importorskip("iris", reason="fray.iris_backend needs fray[iris] (Python >= 3.12)")
    from fray.iris.client import IrisClient
    from fray.iris_backend import FrayIrisClient, convert_constraints, convert_resources

    assert FrayIrisClient is IrisClient
    resources = fray.ResourceConfig(cpu=2, ram="4g", preemptible=False, regions=["us-central1"])
    assert convert_resources(resources).cpu == 2
    assert len(convert_constraints(resources)) == 2


# ----- values ----------------------------------------------------------------------------------


def test_resource_builders_and_measures() -> None:
    from fray.types import GpuConfig, ResourceConfig, TpuConfig

    cpu = ResourceConfig.with_cpu(cpu=4, ram="8g")
    assert (cpu.cpu, cpu.ram, cpu.chip_count(), cpu.device_flops(), cpu.total_flops()) == (4, "8g", 0, 0.0, 0.0)

    gpu = ResourceConfig.with_gpu("H100", 8, ram="64g")
    assert gpu.device == GpuConfig(variant="H100", count=8) == GpuConfig("H100", 8)
    assert gpu.device.variant == gpu.device.type == "H100"
    assert gpu.chip_count() == 8
    assert gpu.device_flops() == pytest.approx(989.5e12)
    assert gpu.total_flops("bf16") == pytest.approx(8 * 989.5e12)

    tpu = ResourceConfig.with_tpu("v5p-8", slice_count=4)
    assert tpu.device == TpuConfig(variant="v5p-8") and tpu.device.variant == "v5p-8"
    assert tpu.replicas == 4
    assert tpu.chip_count() == 4 * 4  # four v5p-8 slices of 4 chips
    assert tpu.total_flops() == pytest.approx(16 * 459e12)

    either = ResourceConfig.with_tpu(["v5p-8", "v4-8"])
    assert either.device_choices == (TpuConfig("v5p-8"), TpuConfig("v4-8"))
    with pytest.raises(ConfigError, match="same hosts"):
        ResourceConfig.with_tpu(["v6e-4", "v6e-16"])


def test_scale() -> None:
    from fray.types import ResourceConfig

    base = ResourceConfig(cpu=2, ram="4g", disk="10g")
    assert base.scale(2) == dataclasses.replace(base, cpu=4, ram="8g", disk="20g")
    half = base.scale(cpu=0.5)
    assert (half.cpu, half.ram, half.disk) == (1, "4g", "10g")
    assert base.scale(ram=1.5).ram_bytes == 6 << 30
    with pytest.raises(ConfigError):
        base.scale(2, cpu=3)


def test_marin_resource_fields() -> None:
    from fray.types import ANY_REGION, Entrypoint, JobRequest, ResourceConfig, TpuConfig

    assert ResourceConfig(regions=[ANY_REGION]).regions is None
    named = ResourceConfig(device=TpuConfig("v5p-8"), device_alternatives=["v4-8"])
    assert named.device_choices == (TpuConfig("v5p-8"), TpuConfig("v4-8"))
    assert ResourceConfig(device_alternatives=["tpu:v6e-8", "v5litepod-8"]).device == TpuConfig("v6e-8")

    request = JobRequest("j", Entrypoint.from_binary("true"), resources=ResourceConfig(image="ghcr.io/x:1", replicas=2))
    assert request.replicas == 2  # None takes the resources' replicas
    assert request.environment is not None and request.environment.docker_image == "ghcr.io/x:1"
    assert JobRequest("j", Entrypoint.from_binary("true"), replicas=3).replicas == 3
    assert JobRequest("j", Entrypoint.from_binary("true")).replicas == 1


def test_tpu_facts() -> None:
    from fray.types import get_tpu_topology, tpu_family, tpu_hbm_bytes_per_chip, tpu_hbm_capacity_bytes

    assert tpu_family("v5litepod-16") == "v5e"
    info = get_tpu_topology("v4-16")
    assert (info.name, info.chip_count, info.host_count, info.vm_count, info.chips_per_vm) == ("v4-16", 8, 2, 2, 4)
    assert tpu_hbm_bytes_per_chip("v6e") == 32 << 30
    assert tpu_hbm_capacity_bytes("v5p-8") == 4 * tpu_hbm_bytes_per_chip("v5p")
    with pytest.raises(ConfigError):
        get_tpu_topology("v9-8")


def test_device_flops_for_jax_device() -> None:
    from fray.device_flops import device_flops_for_jax_device

    assert device_flops_for_jax_device("TPU v5 lite") == pytest.approx(197e12)
    assert device_flops_for_jax_device("TPU v4") == pytest.approx(275e12)
    assert device_flops_for_jax_device("NVIDIA H100 80GB HBM3") == pytest.approx(989.5e12)
    assert device_flops_for_jax_device("NVIDIA A100-SXM4-40GB", "fp32") == pytest.approx(19.5e12)
    assert device_flops_for_jax_device("cpu") is None


def test_environment_and_job_request_fields() -> None:
    from fray.types import Entrypoint, EnvironmentConfig, JobRequest, create_environment

    env = create_environment(env_vars={"A": "1"}, extras=["tpu"], secrets={"TOKEN": "t"}, setup_scripts=[])
    assert isinstance(env, EnvironmentConfig)
    assert (env.extras, env.secrets, env.setup_scripts, env.env_vars) == (("tpu",), {"TOKEN": "t"}, (), {"A": "1"})
    request = JobRequest(
        "j", Entrypoint.from_callable(print), processes_per_task=1, max_task_failures=0, priority=0, timeout=None
    )
    assert request.entrypoint.callable_entrypoint is request.entrypoint
    assert request.entrypoint.binary_entrypoint is None
    assert Entrypoint.from_binary("ls").binary_entrypoint is not None


def test_actor_config_marin_fields() -> None:
    from fray.types import ActorConfig

    assert ActorConfig(max_restarts=None, max_task_retries=None) == ActorConfig()
    assert ActorConfig(max_task_retries=3).max_restarts == 3  # retried calls need an actor to reach
    assert ActorConfig(priority=5).priority == 5


def test_job_status_finished_on_class_and_instance() -> None:
    from fray.client import JobStatus

    assert JobStatus.SUCCEEDED.finished and not JobStatus.RUNNING.finished
    assert JobStatus.finished(JobStatus.FAILED) and not JobStatus.finished(JobStatus.PENDING)
    assert JobStatus.finished("stopped")
    assert [s.name for s in JobStatus] == ["PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"]


# ----- current client ------------------------------------------------------------------------


class FakeClient:
    """What a marin test hands to set_current_client: the protocol's job and actor methods only."""

    def submit(self, request: Any, adopt_existing: bool = True) -> Any:
        return ("submitted", request.name)

    def create_actor(self, actor_class: type, *args: Any, name: str, **kwargs: Any) -> Any:
        return None

    def create_actor_group(self, actor_class: type, *args: Any, name: str, count: int, **kwargs: Any) -> Any:
        return None

    def shutdown(self, wait: bool = True) -> None:
        return None


def test_current_client_both_ways() -> None:
    import fray.current_client
    from fray.current_client import _current_client_var, current_client, set_current_client

    assert callable(fray.current_client)
    assert fray.current_client() is current_client()
    fake = FakeClient()
    with set_current_client(fake) as entered:  # type: ignore[arg-type]
        assert entered is fake
        assert fray.current_client() is fake and current_client() is fake and _current_client_var.get() is fake
        assert fray.current_client().submit(fray.JobRequest("x", fray.Entrypoint.from_binary("true"))) == (
            "submitted",
            "x",
        )
    assert fray.current_client() is not fake
    with pytest.raises(ConfigError, match="no submit"), set_current_client(object()):  # type: ignore[arg-type]
        pass


def test_current_client_function_survives_submodule_import_in_a_fresh_process() -> None:
    code = (
        "import fray; f = fray.current_client; c = f();"
        "import fray.current_client; assert fray.current_client() is c;"
        "from fray.current_client import current_client; assert current_client() is c;"
        "from fray import current_client as g; assert g() is c; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "ok"


# ----- jobs ------------------------------------------------------------------------------------


# adopt_existing is specified on every backend in tests/conformance/test_adopt.py.


def test_marin_settings_fray_cannot_honour_are_refused_by_name() -> None:
    from fray.local_backend import LocalClient
    from fray.types import ActorConfig, Entrypoint, JobRequest, ResourceConfig, create_environment

    with LocalClient() as client:
        with pytest.raises(ConfigError, match="priority=3"):
            client.submit(JobRequest("p", Entrypoint.from_binary("true"), priority=3))
        with pytest.raises(ConfigError, match="extras"):
            client.submit(JobRequest("e", Entrypoint.from_binary("true"), environment=create_environment(extras=["x"])))
        with pytest.raises(ConfigError, match="target_cluster"):
            client.submit(JobRequest("t", Entrypoint.from_binary("true"), resources=ResourceConfig(target_cluster="c")))
        with pytest.raises(ConfigError, match="priority"):
            client.create_actor(_Counter, name="c", actor_config=ActorConfig(priority=1))


def test_local_job_handle_from_a_future() -> None:
    from fray.client import JobFailed, JobStatus, wait_all
    from fray.local_backend import LocalJobHandle

    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    handle = LocalJobHandle("marin-job", future)
    assert handle.job_id == "marin-job" and handle.status() == JobStatus.PENDING
    threading.Timer(0.05, future.set_result, (None,)).start()
    assert wait_all([handle], timeout=10) == [JobStatus.SUCCEEDED]
    assert handle.logs() == []

    failing: concurrent.futures.Future[None] = concurrent.futures.Future()
    failing.set_exception(ValueError("boom"))
    bad = LocalJobHandle("bad", failing)
    with pytest.raises(JobFailed, match="boom"):
        bad.wait()
    assert bad.wait(raise_on_failure=False) == JobStatus.FAILED

    pending: concurrent.futures.Future[None] = concurrent.futures.Future()
    stopped = LocalJobHandle("stopped", pending)
    stopped.terminate()
    assert stopped.status() == JobStatus.STOPPED


# ----- actors ----------------------------------------------------------------------------------


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self, k: int) -> int:
        self.n += k
        return self.n

    def whoami(self) -> tuple[int, str | None, bool, bool]:
        from fray.actor import current_actor

        ctx = current_actor()
        return ctx.index, ctx.group_name, ctx.handle is not None, ctx.shutdown_event.is_set()


def test_actor_group_method_submit_and_current_actor() -> None:
    from fray.local_backend import LocalClient
    from fray.types import ActorConfig

    with LocalClient() as client:
        group = client.create_actor_group(
            _Counter, name="counters", count=2, actor_config=ActorConfig(max_concurrency=2, max_task_retries=1)
        )
        first, second = group.wait_ready(timeout=30)
        assert first.add.submit(2).result(timeout=30) == 2
        assert first.add.remote(3).result(timeout=30) == 5
        assert second.whoami.submit().result(timeout=30) == (1, "counters", True, False)
        group.shutdown()


# ----- marin's real signatures ------------------------------------------------------------------

# Names of marin-fray 0.2.227 that Fray does not have yet; each is listed in docs/marin.md.
KNOWN_GAPS = {"EnvironmentConfig.secret_behavior"}


_READ_SIGNATURES = r"""
import dataclasses, inspect, json
import fray.types as t, fray.client as c, fray.local_backend as lb
out = {"fields": {}, "methods": {}}
for name in ("ResourceConfig", "EnvironmentConfig", "JobRequest", "ActorConfig"):
    out["fields"][name] = [f.name for f in dataclasses.fields(getattr(t, name))]
for cls, names in ((t.ResourceConfig, ("with_cpu", "with_gpu", "with_tpu", "scale", "chip_count", "device_flops",
                   "total_flops")), (c.Client, ("submit", "host_actor")), (lb.LocalJobHandle, ("wait", "terminate", "logs"))):
    for name in names:
        out["methods"][f"{cls.__name__}.{name}"] = list(inspect.signature(getattr(cls, name)).parameters)
out["methods"]["LocalJobHandle.__init__"] = list(inspect.signature(lb.LocalJobHandle).parameters)
out["status"] = [m.name for m in t.JobStatus]
import importlib
out["names"] = {}
for path in NAMED_MODULES:
    module = importlib.import_module(path)
    names = getattr(module, "__all__", None) or [
        n for n, v in vars(module).items() if (getattr(v, "__module__", None) or "").startswith("fray")
    ]
    out["names"][path] = sorted(n for n in names if not n.startswith("_"))
import fray
print(fray.__file__)
print(json.dumps(out))
"""
# marin-fray's modules whose public names Fray offers too (fray.iris_backend: see test_iris_backend_path).
NAMED_MODULES = ["fray.types", "fray.client", "fray.current_client", "fray.local_backend", "fray.actor", "fray.cluster"]
# marin-fray's public names Fray does not offer; each is listed in docs/marin.md with its reason.
KNOWN_NAME_GAPS = {
    "fray.types": {"TpuHostResources"},
}


@pytest.mark.timeout(SUITE_TIMEOUT + INSTALL_TIMEOUT)
def test_our_surface_covers_marins_public_signatures() -> None:
    """Reads only names and parameters from marin-fray, in the cached Python 3.12 venv, and compares.

    marin-fray lives in a directory of its own in that venv (``marin_fray_dir``), put first on
    ``PYTHONPATH`` here only, so that ``import fray`` there is marin's.
    """
    python, found = find_python312()
    if python is None:
        pytest.skip(f"marin-fray's signatures were not compared: it needs Python >= 3.12 and {found}")
    try:
        venv, _ = ensure_marin_venv(python)
    except VenvBuildError as exc:
        pytest.fail(str(exc), pytrace=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FRAY_", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(marin_fray_dir(venv))
    run = subprocess.run(
        [str(venv / "bin" / "python"), "-c", f"NAMED_MODULES = {NAMED_MODULES!r}\n{_READ_SIGNATURES}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0, f"marin-fray does not import in {venv}: {run.stderr.strip().splitlines()[-5:]}"
    assert "marin-fray" in run.stdout.splitlines()[0], "the fray read was not marin's"
    marin = json.loads(run.stdout.splitlines()[-1])
    import fray.types as ours
    from fray.client import Client
    from fray.local_backend import LocalJobHandle

    for name, fields in marin["fields"].items():
        ours_fields = {f.name for f in dataclasses.fields(getattr(ours, name))}
        ours_fields |= {gap.split(".")[1] for gap in KNOWN_GAPS if gap.startswith(f"{name}.")}
        assert set(fields) <= ours_fields, f"{name} lacks {set(fields) - ours_fields}"
    classes = {"ResourceConfig": ours.ResourceConfig, "Client": Client, "LocalJobHandle": LocalJobHandle}
    import inspect

    for qualified, params in marin["methods"].items():
        cls_name, method = qualified.split(".")
        target = classes[cls_name] if method == "__init__" else getattr(classes[cls_name], method)
        mine = list(inspect.signature(target).parameters)
        known = [p for p in params if p not in ("args", "kwargs")]
        assert set(known) <= set(mine), f"{qualified}: marin has {params}, Fray has {mine}"
    assert marin["status"] == [s.name for s in ours.JobStatus]
    for path, names in marin["names"].items():
        module = importlib.import_module(path)
        missing = {name for name in names if not hasattr(module, name)} - KNOWN_NAME_GAPS.get(path, set())
        assert not missing, f"marin's {path} has {sorted(missing)}, Fray's does not"
        assert KNOWN_NAME_GAPS.get(path, set()) <= set(names), f"a known gap of {path} is not marin's any more"
