"""Job environments on a Fray cluster: pip_packages in cached per-requirements environments, shipped workspaces,
docker_image refused where no container runtime exists. Needs PyPI for the package it installs."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray.cluster.client import ClusterClient
from fray.cluster.protocol.controller_client import ops_client
from fray.cluster.server.envs._environments import container_command
from fray.cluster.server.envs._shipping import CONTAINER_RUNTIME_ATTRIBUTE
from fray.cluster.server.launcher import LocalCluster
from fray.errors import ConfigError, JobFailed
from fray.job import Entrypoint, EnvironmentConfig, JobRequest

# A small pure-Python package that the test environment does not have.
PACKAGE = "inflection"


def camelize(word: str) -> str:
    import inflection  # only in the job's environment

    return str(inflection.camelize(word))


def print_camelized(word: str) -> None:
    print(camelize(word))


def read_workspace() -> None:
    import wsmod  # the shipped workspace is on the import path

    print(f"value={wsmod.VALUE} data={Path('data.txt').read_text().strip()} cwd_is_workspace={Path.cwd().name}")


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster with one worker, so that every job lands where the previous one built its environment."""
    tests_dir = str(Path(__file__).resolve().parents[1])
    paths = [p for p in sys.path if p.startswith(tests_dir)]
    cluster = LocalCluster(tmp_path_factory.mktemp("envs"), env={"PYTHONPATH": os.pathsep.join(paths)})
    try:
        cluster.start(1, "--cpu", "4")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def client(one_worker: LocalCluster) -> Iterator[ClusterClient]:
    c = ClusterClient(one_worker.address, token=one_worker.token)
    yield c
    c.shutdown(wait=False)


def _start_delay(cluster: LocalCluster, job_id: str) -> float:
    ops = ops_client(cluster.address, cluster.token)
    try:
        detail = ops.job_detail(job_id)
    finally:
        ops.close()
    started = min(t["started_at"] for t in detail["tasks"] if t["started_at"] is not None)
    return float(started - detail["submitted_at"])


def test_pip_packages_are_installed_once_per_worker_and_the_job_imports_them(
    client: ClusterClient, one_worker: LocalCluster
):
    if importlib.util.find_spec(PACKAGE) is not None:
        pytest.skip(f"{PACKAGE} is installed here, so the test would prove nothing")
    env = EnvironmentConfig(pip_packages=[PACKAGE])
    first = client.submit(
        JobRequest(
            name="pip-1", entrypoint=Entrypoint.from_callable(print_camelized, args=("fray_job",)), environment=env
        )
    )
    first.wait(timeout=600)
    assert "FrayJob" in first.logs()
    plain = client.submit(JobRequest(name="plain", entrypoint=Entrypoint.from_callable(print, args=("x",))))
    plain.wait(timeout=120)
    second = client.submit(
        JobRequest(name="pip-2", entrypoint=Entrypoint.from_callable(print_camelized, args=("again",)), environment=env)
    )
    second.wait(timeout=120)
    assert "Again" in second.logs()
    binary = client.submit(
        JobRequest(
            name="pip-bin",
            entrypoint=Entrypoint.from_binary("python", ["-c", f"import {PACKAGE}, fray; print('both import')"]),
            environment=env,
        )
    )
    binary.wait(timeout=120)
    assert "both import" in binary.logs()
    built, cached, without = (_start_delay(one_worker, j.job_id) for j in (first, second, plain))
    print(
        f"\nstart delay (submit -> running): first job with {PACKAGE} {built:.2f}s (builds the environment), "
        f"second {cached:.3f}s (cached), a job without pip_packages {without:.3f}s; "
        f"extra for the cached one: {cached - without:+.3f}s (issue 12 asks for <= 1 s)"
    )
    # The first job built the environment once; the job's own log says so.
    assert any("building an environment" in line for line in first.logs())
    assert not any("building an environment" in line for line in second.logs())


def test_a_requirement_that_does_not_install_fails_the_job_with_the_installer_output(client: ClusterClient):
    env = EnvironmentConfig(pip_packages=["fray-no-such-package-on-any-index==0.0.1"])
    job = client.submit(JobRequest(name="bad-pip", entrypoint=Entrypoint.from_callable(print), environment=env))
    with pytest.raises(JobFailed, match="cannot prepare the job's environment"):
        job.wait(timeout=600)


def test_a_workspace_becomes_the_working_directory_and_import_path(
    client: ClusterClient, one_worker: LocalCluster, tmp_path: Path
):
    project = tmp_path / "proj"
    (project / "wsmod").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "wsmod"\nversion = "0"\n')
    (project / "wsmod" / "__init__.py").write_text("VALUE = 42\n")
    (project / "data.txt").write_text("hello\n")
    (project / ".git").mkdir()
    (project / ".git" / "big").write_bytes(b"x" * 1000)  # never shipped
    env = EnvironmentConfig(workspace=str(project))
    job = client.submit(JobRequest(name="ws", entrypoint=Entrypoint.from_callable(read_workspace), environment=env))
    job.wait(timeout=120)
    assert any(line.startswith("value=42 data=hello cwd_is_workspace=sha256-") for line in job.logs()), job.logs()
    binary = client.submit(
        JobRequest(
            name="ws-bin",
            entrypoint=Entrypoint.from_binary("bash", ["-c", "python -c 'import wsmod; print(wsmod.VALUE)'; ls -a"]),
            environment=env,
        )
    )
    binary.wait(timeout=120)
    lines = binary.logs()
    assert "42" in lines and "data.txt" in lines and ".git" not in lines


def test_a_plain_folder_is_a_workspace_and_a_missing_one_is_refused(client: ClusterClient, tmp_path: Path):
    # A folder of scripts with no pyproject.toml ships as it is: the job runs in it and imports from it.
    (tmp_path / "plainmod.py").write_text("VALUE = 7\n")
    env = EnvironmentConfig(workspace=str(tmp_path))
    job = client.submit(
        JobRequest(
            name="ws-plain",
            entrypoint=Entrypoint.from_binary("python", ["-c", "import plainmod; print('plain', plainmod.VALUE)"]),
            environment=env,
        )
    )
    job.wait(timeout=120)
    assert "plain 7" in job.logs()
    missing = EnvironmentConfig(workspace=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"is not a directory"):
        client.submit(JobRequest(name="ws-bad", entrypoint=Entrypoint.from_callable(print), environment=missing))


def test_docker_image_is_refused_at_submit_without_a_container_runtime(client: ClusterClient):
    workers = client._controller.list_workers()
    if any(w.info.attributes.get(CONTAINER_RUNTIME_ATTRIBUTE) for w in workers):
        pytest.skip("this machine has a container runtime")
    env = EnvironmentConfig(docker_image="python:3.11-slim")
    with pytest.raises(ConfigError, match="needs a worker with a container runtime"):
        client.submit(JobRequest(name="docker", entrypoint=Entrypoint.from_callable(print), environment=env))


def test_the_container_command_names_variables_without_their_values():
    command = container_command(
        "docker", "img:1", ["python", "-m", "x"], {"FRAY_JOB_ID": "secret-ish", "A": "1"}, "/w", ["/w", "/t"]
    )
    assert command[:3] == ["docker", "run", "--rm"]
    assert command[-4:] == ["img:1", "python", "-m", "x"]
    assert "-e" in command and "FRAY_JOB_ID" in command and "secret-ish" not in json.dumps(command)
    assert "/w:/w" in command and "/t:/t" in command
