"""marin's fields in a job's environment on a worker: what ``EnvironmentConfig.extras`` names in a project's
``pyproject.toml`` (:mod:`fray.cluster.server.envs._project`), and where ``processes_per_task``'s supervisor runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fray.cluster.protocol.messages import JobSpec
from fray.cluster.server.envs._environments import prepare
from fray.cluster.server.envs._project import applicable, read_project, requirements_of
from fray.errors import ConfigError
from fray.job import Entrypoint, EnvironmentConfig, JobRequest

PYPROJECT = """
[project]
name = "My_Project"
version = "1"
dependencies = ["base-dep"]

[project.optional-dependencies]
gpu = ["jax[cuda]>=0.4", "my-project[io]"]
IO = ["fsspec"]

[dependency-groups]
dev = ["pytest", {include-group = "lint"}]
lint = ["ruff"]
loop = [{include-group = "loop"}]
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    return tmp_path


def test_an_extra_brings_the_projects_dependencies_and_the_extras_it_names(project: Path):
    found = requirements_of(read_project(project, "j"), ["GPU"], "j")
    assert found == ["base-dep", "jax[cuda]>=0.4", "fsspec"]  # names compare normalized; my-project[io] followed


def test_a_group_brings_its_own_and_included_groups_only(project: Path):
    assert requirements_of(read_project(project, "j"), ["dev"], "j") == ["pytest", "ruff"]


def test_unknown_names_are_refused_with_what_the_project_has(project: Path):
    with pytest.raises(
        ConfigError, match=r"'cuda', 'docs' neither as an extra.*\['gpu', 'io'\].*\['dev', 'lint', 'loop'\]"
    ):
        requirements_of(read_project(project, "j"), ["gpu", "cuda", "docs"], "j")


def test_a_group_that_includes_itself_is_refused(project: Path):
    with pytest.raises(ConfigError, match="includes itself"):
        requirements_of(read_project(project, "j"), ["loop"], "j")


def test_dynamic_dependencies_cannot_give_extras(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "d"\ndynamic = ["optional-dependencies"]\n[project.optional-dependencies]\nx = ["a"]\n'
    )
    with pytest.raises(ConfigError, match="dynamic"):
        requirements_of(read_project(tmp_path, "j"), ["x"], "j")


def test_a_directory_without_pyproject_says_to_give_the_workspace(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"no pyproject\.toml; set EnvironmentConfig\(workspace=\.\.\.\)"):
        read_project(tmp_path, "j")


def test_requirements_for_another_platform_are_not_checked_here():
    assert applicable(["a; sys_platform == 'no-such-platform'", "b"]) == ["b"]


def test_a_containers_processes_run_under_the_supervisor_inside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The supervisor runs in the image (whose python has Fray), around the image's interpreter.
    monkeypatch.setenv("FRAY_CONTAINER_RUNTIME", "docker")
    request = JobRequest(
        name="ranked",
        entrypoint=Entrypoint.from_callable(print),
        environment=EnvironmentConfig(docker_image="img:1"),
        processes_per_task=2,
    )
    payload, failure = str(tmp_path / "payload.pkl"), str(tmp_path / "failure.pkl")
    argv = [sys.executable, "-m", "fray.process._jobmain", payload, failure]
    ready = prepare(
        JobSpec.from_request(request), argv, {}, str(tmp_path),
        workdir=tmp_path, controller="127.0.0.1:1", token=None, log=print,
    )  # fmt: skip
    assert not ready.forkable
    inner = ["python", "-m", "fray.process._jobmain", payload, failure]
    supervisor = ["python", "-m", "fray.process._ranks", "--nproc", "2", "--failure", failure, "--"]
    assert ready.argv[ready.argv.index("img:1") + 1 :] == [*supervisor, *inner]
