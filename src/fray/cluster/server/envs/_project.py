"""A job's Python project and the requirements its extras name (``EnvironmentConfig.extras``).

marin's steps name "extras" of the job's project (``EnvironmentConfig(extras=["gpu"])``). In
Fray each name is an extra of the project -- ``[project.optional-dependencies]`` of the
``pyproject.toml`` in its directory -- or, failing that, a dependency group of it
(``[dependency-groups]``, PEP 735). An extra brings the project's own ``dependencies`` along,
as ``pip install "project[gpu]"`` does; a group brings only its own requirements (PEP 735).
A requirement naming the project itself with extras (``project[gpu,io]``) and a group's
``{include-group = "..."}`` are followed.

The file is read statically (``tomllib``), the same way where the job is submitted (to refuse
a name the project lacks, at once) and where it runs: a Fray cluster worker installs the
requirements into the job's cached environment (:mod:`fray.cluster.server.envs._environments`), the
local backend checks that they are installed in its own. Light on purpose: nothing here loads
the client, the worker or an installer.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fray.core._client_core import check_installed
from fray.errors import ConfigError
from fray.job import EnvironmentConfig

__all__ = ["Project", "applicable", "normalize", "read_project", "requirements_of"]

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


def normalize(name: str) -> str:
    """A project, extra or group name as the packaging standards compare them (PEP 503, 685, 735)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Project:
    """What Fray reads of a ``pyproject.toml``: the project's name, dependencies, extras and groups."""

    path: Path
    name: str
    dependencies: tuple[str, ...]
    extras: Mapping[str, tuple[str, ...]]
    """Normalized extra name -> its requirements."""
    groups: Mapping[str, tuple[Any, ...]]
    """Normalized group name -> its entries (requirement strings and ``{"include-group": name}`` tables)."""
    dynamic: frozenset[str]

    def describe(self) -> str:
        """``"it has the extras ['gpu'] and the dependency groups ['dev']"`` (what a name may be)."""
        extras = f"the extras {sorted(self.extras)}" if self.extras else "no extras"
        groups = f"the dependency groups {sorted(self.groups)}" if self.groups else "no dependency groups"
        return f"it has {extras} and {groups}"


def _strings(value: object, where: str, path: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: {where} must be a list of requirement strings")
    return tuple(value)


def read_project(directory: str | Path, job: str) -> Project:
    """The project in ``directory`` (its ``pyproject.toml``); ConfigError saying what is missing or malformed."""
    path = Path(directory).expanduser() / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"job {job!r}: EnvironmentConfig.extras names extras of the job's project, and {str(directory)!r} holds "
            "no pyproject.toml; set EnvironmentConfig(workspace=...) to the project's directory"
        ) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"job {job!r}: cannot read {path}: {exc}") from None
    project = data.get("project", {})
    groups = data.get("dependency-groups", {})
    if not isinstance(project, dict) or not isinstance(groups, dict):
        raise ConfigError(f"job {job!r}: {path}: [project] and [dependency-groups] must be tables")
    optional = project.get("optional-dependencies", {})
    if not isinstance(optional, dict):
        raise ConfigError(f"job {job!r}: {path}: [project.optional-dependencies] must be a table")
    for name, entries in groups.items():
        if not isinstance(entries, list):
            raise ConfigError(f"job {job!r}: {path}: dependency group {name!r} must be a list")
    dynamic = project.get("dynamic", [])
    return Project(
        path=path,
        name=str(project.get("name", "")),
        dependencies=_strings(project.get("dependencies", []), "[project] dependencies", path),
        extras={normalize(k): _strings(v, f"extra {k!r}", path) for k, v in optional.items()},
        groups={normalize(k): tuple(v) for k, v in groups.items()},
        dynamic=frozenset(dynamic) if isinstance(dynamic, list) else frozenset(),
    )


def requirements_of(project: Project, names: Sequence[str], job: str) -> list[str]:
    """The requirements the extras or groups ``names`` of ``project`` bring, in order, each once.

    ConfigError naming every name the project defines neither as an extra nor as a group
    (and what it has), and for extras whose requirements the project declares ``dynamic``.
    """
    unknown = [n for n in names if normalize(n) not in project.extras and normalize(n) not in project.groups]
    if unknown:
        raise ConfigError(
            f"job {job!r}: EnvironmentConfig(extras={list(names)!r}): project {project.name or '(unnamed)'!r} "
            f"({project.path}) defines {', '.join(repr(n) for n in unknown)} neither as an extra "
            f"([project.optional-dependencies]) nor as a dependency group ([dependency-groups]); {project.describe()}"
        )
    extras = [normalize(n) for n in names if normalize(n) in project.extras]
    dynamic = sorted(project.dynamic & {"dependencies", "optional-dependencies"})
    if extras and dynamic:
        raise ConfigError(
            f"job {job!r}: project {project.name!r} ({project.path}) declares {dynamic} dynamic, so its extras "
            f"{extras} cannot be read from pyproject.toml; list them there statically, or name the requirements "
            "in EnvironmentConfig(pip_packages=...)"
        )
    found: dict[str, None] = {}
    if extras:
        _add_extras(project, extras, found, set())
    for name in names:
        if normalize(name) not in project.extras:
            _add_group(project, normalize(name), found, [], job)
    return list(found)


def _add(project: Project, requirements: Iterable[str], found: dict[str, None], seen: set[str]) -> None:
    for requirement in requirements:
        match = _REQUIREMENT.match(requirement)
        if match is not None and project.name and normalize(match.group(1)) == normalize(project.name):
            # The project itself, with extras: what they bring, not a distribution to install.
            _add_extras(project, [normalize(e) for e in (match.group(2) or "").split(",") if e.strip()], found, seen)
        else:
            found.setdefault(requirement.strip(), None)


def _add_extras(project: Project, extras: Iterable[str], found: dict[str, None], seen: set[str]) -> None:
    if "" not in seen:  # the project's own dependencies come with any of its extras, once
        seen.add("")
        _add(project, project.dependencies, found, seen)
    for extra in extras:
        if extra not in seen and extra in project.extras:
            seen.add(extra)
            _add(project, project.extras[extra], found, seen)


def _add_group(project: Project, group: str, found: dict[str, None], within: list[str], job: str) -> None:
    if group in within:
        raise ConfigError(
            f"job {job!r}: {project.path}: dependency group {group!r} includes itself ({' -> '.join([*within, group])})"
        )
    if group not in project.groups:
        raise ConfigError(
            f"job {job!r}: {project.path}: dependency group {within[-1]!r} includes {group!r}, not defined"
        )
    for entry in project.groups[group]:
        if isinstance(entry, str):
            _add(project, [entry], found, set())
        elif isinstance(entry, dict) and isinstance(entry.get("include-group"), str):
            _add_group(project, normalize(entry["include-group"]), found, [*within, group], job)
        else:
            raise ConfigError(f"job {job!r}: {project.path}: dependency group {group!r} holds {entry!r}")


def applicable(requirements: Iterable[str]) -> list[str]:
    """``requirements`` whose environment markers hold here (all of them when ``packaging`` is not installed)."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:
        return list(requirements)
    kept = []
    for text in requirements:
        try:
            marker = Requirement(text).marker
        except InvalidRequirement:
            kept.append(text)  # named as it is: the check that follows says what is wrong with it
            continue
        if marker is None or marker.evaluate():
            kept.append(text)
    return kept


def check_extras(job: str, environment: EnvironmentConfig, backend: str) -> None:
    """Refuse a job whose ``extras`` bring requirements not installed here, naming each (at submit).

    The job's project is the workspace's, else the current directory's: such a backend runs
    jobs in this Python environment, so the extras are checked, not installed.
    """
    if not environment.extras:
        return
    project = read_project(environment.workspace or os.getcwd(), job)
    requirements = applicable(requirements_of(project, environment.extras, job))
    try:
        check_installed(job, requirements, backend)
    except ConfigError as exc:
        raise ConfigError(
            f"{exc} (the requirements of EnvironmentConfig(extras={list(environment.extras)!r}) of project "
            f"{project.name!r}, {project.path})"
        ) from None
