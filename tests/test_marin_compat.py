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
    # marin's LocalClient is the local backend with marin's local rules; Fray's default refines it.
    assert fray.local_backend.LocalClient is fray.local.MarinLocalClient
    assert issubclass(fray.local.LocalClient, fray.local_backend.LocalClient)
    assert isinstance(fray.current_client(), fray.local_backend.LocalClient)
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
    with pytest.raises(ConfigError, match="vm_count and chips_per_vm"):
        ResourceConfig.with_tpu(["v6e-4", "v6e-16"])
    # marin's sizing: half the TPU host, and a task per TPU VM in replicas (a Fray replica is a slice).
    pod = ResourceConfig.with_tpu("v5p-16", slice_count=2)
    assert (pod.cpu, pod.ram, pod.replicas, pod.replica_count, pod.chip_count()) == (104, "224g", 4, 2, 16)
    assert ResourceConfig.with_tpu("v5p-16", cpu=8).cpu == 8


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

    assert ResourceConfig(regions=[ANY_REGION]).placement_regions is None  # anywhere, said explicitly
    mixed = ResourceConfig(regions=[ANY_REGION, "us-central1"])  # refused where it is placed, as marin does
    with pytest.raises(ConfigError, match="ANY_REGION cannot be combined"):
        _ = mixed.placement_regions
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
    assert ActorConfig(priority=3).priority == 3  # a priority band (Iris's numbers)
    with pytest.raises(ConfigError, match=r"ActorConfig\(priority=5\) is not a priority band"):
        ActorConfig(priority=5)


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
    # marin's tests install bare markers too: accepted, and what a step running under it sees.
    marker = object()
    with set_current_client(marker):  # type: ignore[arg-type]
        assert current_client() is marker
    with pytest.raises(ConfigError, match="client_from_spec"), set_current_client("local"):  # type: ignore[arg-type]
        pass
    with pytest.raises(ConfigError, match="an instance"), set_current_client(FakeClient):  # type: ignore[arg-type]
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
    from fray.types import Entrypoint, JobRequest, ResourceConfig, create_environment

    with LocalClient() as client:
        with pytest.raises(ConfigError, match="secrets"):
            secrets = create_environment(secrets={"HF_TOKEN": "env:HF_TOKEN"})
            client.submit(JobRequest("e", Entrypoint.from_binary("true"), environment=secrets))
        with pytest.raises(ConfigError, match="target_cluster"):
            client.submit(JobRequest("t", Entrypoint.from_binary("true"), resources=ResourceConfig(target_cluster="c")))
        # Priority bands are honoured (tests/conformance/test_priority.py); what is not a band is refused by name.
        with pytest.raises(ConfigError, match=r"JobRequest\(priority=9\) is not a priority band"):
            client.submit(JobRequest("p", Entrypoint.from_binary("true"), priority=9))


def test_local_job_handle_from_a_future() -> None:
    from fray.client import JobFailed, JobStatus, wait_all
    from fray.local_backend import LocalJobHandle

    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    handle = LocalJobHandle("marin-job", future)
    assert handle.job_id == "marin-job" and handle.status() == JobStatus.PENDING
    threading.Timer(0.05, future.set_result, (None,)).start()
    assert wait_all([handle], timeout=10) == [JobStatus.SUCCEEDED]
    assert handle.logs() == ()

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

#: marin-fray's modules, all compared name by name with Fray's.
SIGNATURE_MODULES = [
    "fray.types",
    "fray.client",
    "fray.current_client",
    "fray.local_backend",
    "fray.actor",
    "fray.cluster",
    "fray.iris_backend",
    "fray.device_flops",
]
#: marin's private names that marin's own tests and fixtures use: compared too.
PRIVATE_HOOKS = {
    "fray.actor": ["_current_actor_ctx", "_set_current_actor", "_reset_current_actor"],
    "fray.current_client": ["_current_client_var"],
    "fray.local_backend": ["_set_current_actor", "_reset_current_actor"],
    "fray.iris_backend": ["_set_current_actor", "_reset_current_actor", "_host_actor"],
}
#: Where Fray's constructor differs from marin's on purpose, by name (in every module): why (docs/marin.md).
SIGNATURE_DIFFERENCES: dict[str, str] = {
    "GpuConfig": "Fray's positional parameters are (type, count): marin's are (variant, kind, count), so marin's "
    "code names count; variant= and kind= are accepted as keywords",
    "TpuConfig": "Fray's positional parameters are (type, topology): marin's are (variant, kind, topology); "
    "variant= and kind= are accepted as keywords",
    "TpuTopologyInfo": "Fray's TpuTopology, built from its own fields; marin's field names are its properties",
    "Entrypoint": "a base class with from_callable/from_binary; marin's Entrypoint(callable_entrypoint=...) "
    "constructor is not offered (every entrypoint reads both of marin's attributes)",
    "FrayEntrypoint": "fray.iris_backend's name for Fray's Entrypoint (the same difference as Entrypoint)",
    "LocalActorHandle": "built by the local backend from its actor (marin's from a registry endpoint name)",
    "LocalActorMethod": "Fray's one RemoteMethod(handle, name) for every backend (marin's wraps a bound method)",
}

# Run in the marin venv twice: with marin-fray first on the path (SPEC is None: read marin's whole
# public surface), then with Fray (SPEC is marin's reading: describe the same names).
_DESCRIBE = r"""
import importlib, inspect, json, sys

def params(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name, p.default is not inspect.Parameter.empty] for p in sig.parameters.values()]

def describe(obj, members=None):
    info = {"callable": callable(obj), "class": inspect.isclass(obj)}
    if callable(obj):
        info["params"] = params(obj)
    if inspect.isclass(obj):
        if members is None:
            members = [n for n in vars(obj) if not n.startswith("_") or n == "__init__"]
        info["members"] = {}
        for name in members:
            raw = inspect.getattr_static(obj, name, None)
            if raw is None and not hasattr(obj, name):
                info["members"][name] = None
            elif isinstance(raw, property):
                info["members"][name] = {"property": True}
            else:
                value = getattr(obj, name, None)
                info["members"][name] = {"callable": callable(value), "params": params(value) if callable(value) else None}
    return info

def public(module):
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value):
            continue
        origin = getattr(value, "__module__", None) or ""
        # Fray's own names, the engines' names marin re-exports (Iris, rigging), and constants.
        if origin.startswith(("fray", "iris", "rigging", "connectrpc")) or isinstance(value, (str, int, float, dict, list, tuple)):
            yield name

out = {}
for path in MODULES:
    module = importlib.import_module(path)
    wanted = SPEC[path] if SPEC is not None else {n: None for n in [*public(module), *HOOKS.get(path, [])]}
    out[path] = {}
    for name, marin in wanted.items():
        if not hasattr(module, name):
            out[path][name] = None
            continue
        members = list((marin or {}).get("members") or {}) if SPEC is not None else None
        out[path][name] = describe(getattr(module, name), members)
import fray
print(fray.__file__)
print(json.dumps(out))
"""


def _describe(python: str, pythonpath: str | None, spec: dict | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FRAY_", "VIRTUAL_ENV"))}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    code = f"MODULES = {SIGNATURE_MODULES!r}\nHOOKS = {PRIVATE_HOOKS!r}\nSPEC = {spec!r}\n{_DESCRIBE}"
    run = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, f"reading the fray surface failed: {run.stderr.strip().splitlines()[-8:]}"
    first, *_, last = run.stdout.splitlines()
    return {"file": first, "surface": json.loads(last)}


def _signature_problems(where: str, marin: list | None, ours: list | None) -> list[str]:
    """What marin's code could call that Fray's signature refuses: a missing name, order, or default."""
    if marin is None or ours is None:
        return [] if marin is None else [f"{where}: Fray's has no readable signature"]
    mine = {name: (kind, default) for name, kind, default in ours}
    open_kwargs = any(kind == "VAR_KEYWORD" for _, kind, _ in ours)
    open_args = any(kind == "VAR_POSITIONAL" for _, kind, _ in ours)
    problems = []
    positional_ours = [name for name, kind, _ in ours if kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    positional_marin = [name for name, kind, _ in marin if kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    for name, kind, default in marin:
        if kind in ("VAR_POSITIONAL", "VAR_KEYWORD") or name.startswith("_"):
            continue
        if name not in mine:
            if not open_kwargs:
                problems.append(f"{where}: no parameter {name!r}")
            continue
        if default and not mine[name][1]:
            problems.append(f"{where}: {name!r} has a default in marin's, not in Fray's")
        if name in positional_marin and not open_args:
            at = positional_marin.index(name)
            if at >= len(positional_ours) or positional_ours[at] != name:
                problems.append(f"{where}: positional parameter {at} is {name!r} in marin's, not in Fray's")
    return problems


@pytest.mark.timeout(SUITE_TIMEOUT + INSTALL_TIMEOUT)
def test_every_marin_name_imports_from_fray_with_marins_signature() -> None:
    """marin-fray's whole public surface (and the private hooks its tests use), compared name by name.

    Both surfaces are read in the cached Python 3.12 venv (marin-fray needs 3.12, and its
    ``fray.iris_backend`` imports Iris): marin-fray with its package first on ``PYTHONPATH``
    (``marin_fray_dir``), Fray as installed there from this checkout.
    """
    python, found = find_python312()
    if python is None:
        pytest.skip(f"marin-fray's signatures were not compared: it needs Python >= 3.12 and {found}")
    try:
        venv, _ = ensure_marin_venv(python)
    except VenvBuildError as exc:
        pytest.fail(str(exc), pytrace=False)
    interpreter = str(venv / "bin" / "python")
    marin = _describe(interpreter, str(marin_fray_dir(venv)), None)
    assert "marin-fray" in marin["file"], "the fray read was not marin's"
    ours = _describe(interpreter, None, marin["surface"])
    assert "marin-fray" not in ours["file"], "the fray read was not this checkout's"
    problems: list[str] = []
    compared = 0
    for path, names in marin["surface"].items():
        for name, theirs in names.items():
            where = f"{path}.{name}"
            mine = ours["surface"][path].get(name)
            compared += 1
            if mine is None:
                problems.append(f"{where}: missing")
                continue
            if theirs["callable"] and not mine["callable"]:
                problems.append(f"{where}: callable in marin's, not in Fray's")
                continue
            if theirs["callable"] and name not in SIGNATURE_DIFFERENCES:
                problems += _signature_problems(where, theirs.get("params"), mine.get("params"))
            for member, their_member in (theirs.get("members") or {}).items():
                label = f"{where}.{member}"
                my_member = (mine.get("members") or {}).get(member)
                if their_member is None:
                    continue
                if my_member is None:
                    problems.append(f"{label}: missing")
                elif their_member.get("callable") and member != "__init__":
                    problems += _signature_problems(label, their_member.get("params"), my_member.get("params"))
    print(f"compared {compared} of marin-fray's names and their members")
    assert not problems, "Fray differs from marin-fray where marin's code would notice:\n" + "\n".join(problems)
