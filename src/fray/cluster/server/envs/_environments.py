"""Where a task runs on a worker: its Python environment, working directory and container.

The worker calls :func:`prepare` once per task, just before it starts the process:

* ``pip_packages``: one virtual environment per distinct set of requirements (and
  interpreter), built once and cached under the worker's directory, with ``uv`` when
  it is installed (else ``venv`` and ``pip``). The environment is layered over the
  worker's own: a ``.pth`` file adds the worker's site directories *after* the
  environment's, so Fray and the worker's packages stay importable and the job's
  requirements win.
* ``workspace``: the packed project the client uploaded (by content hash) is fetched
  from the controller and unpacked once per worker; it becomes the task's working
  directory and is put first on its import path.
* ``extras``: the requirements that the named extras or dependency groups of the
  workspace's project bring (:mod:`fray.cluster.server.envs._project`) join ``pip_packages``:
  one cached environment for both, built the same way (the project itself is not
  installed: it is on the import path already).
* ``processes_per_task`` > 1: the task's command runs under the supervisor of
  :mod:`fray.process._ranks` (inside the container, if any), never from the fork server.
* ``docker_image``: the task runs in that image through the worker's container
  runtime (``docker`` or ``podman``), with the task directory mounted at the same path.

A task that runs anywhere but in the worker's own environment is never started from
the warm fork server (whose interpreter is the worker's).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fray.cluster.protocol.controller_client import CredentialLike, ops_client
from fray.cluster.server.envs._project import read_project, requirements_of
from fray.cluster.server.envs._workspace import unpack_workspace
from fray.core._private_files import private_dir, write_private
from fray.errors import FrayError
from fray.process._ranks import ranked_argv

__all__ = ["EnvironmentFailed", "Prepared", "container_command", "prepare", "runtime_available"]

_READY = ".fray-ready"
# One lock per environment being built, so two tasks needing the same one build it once.
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class EnvironmentFailed(FrayError):
    """A task's environment could not be made (a requirement that does not install, a missing image)."""


@dataclass(frozen=True)
class Prepared:
    """How to start the task: its command, environment variables and directory; ``forkable`` if the fork server may."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    forkable: bool


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def _uv() -> str | None:
    try:
        from uv import find_uv_bin  # the PyPI package ships the binary (fray[envs])
    except ImportError:
        return shutil.which("uv")
    try:
        return str(find_uv_bin())
    except FileNotFoundError:
        return shutil.which("uv")


def _run(argv: Sequence[str], what: str) -> None:
    # An environment is the worker's cache, not the job's output: what the installer creates is private.
    done = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL, umask=0o077)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise EnvironmentFailed(f"{what} failed (exit {done.returncode}):\n{tail}")


def _worker_site_dirs() -> list[str]:
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d)]


def _venv_python(root: Path) -> Path:
    return root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _build_venv(root: Path, requirements: Sequence[str], log: Callable[[str], None]) -> None:
    uv = _uv()
    python = _venv_python(root)
    if uv is not None:
        _run([uv, "venv", "--quiet", "--python", sys.executable, str(root)], "creating the environment (uv venv)")
        _run([uv, "pip", "install", "--quiet", "--python", str(python), *requirements], "uv pip install")
    else:
        log("[fray] uv is not installed (pip install 'fray[envs]'): building with venv and pip, which is slower")
        _run([sys.executable, "-m", "venv", str(root)], "creating the environment (python -m venv)")
        _run([str(python), "-m", "pip", "install", "--quiet", *requirements], "pip install")
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Appended after the environment's own site-packages: the job's requirements win, Fray stays importable.
    lines = [f"import site; site.addsitedir({d!r})" for d in _worker_site_dirs()]
    write_private(Path(purelib, "_fray_worker_site.pth"), "\n".join(lines) + "\n")


def pip_environment(requirements: Sequence[str], workdir: Path, log: Callable[[str], None]) -> Path:
    """The cached environment with ``requirements`` (built now if this worker has none yet); its root."""
    wanted = sorted(dict.fromkeys(r.strip() for r in requirements))
    key_data = json.dumps({"requirements": wanted, "python": sys.executable, "version": sys.version})
    key = hashlib.sha256(key_data.encode()).hexdigest()[:16]
    root = workdir / "envs" / key
    with _lock(key):
        if (root / _READY).exists():
            return root
        if root.exists():  # a build that did not finish (the worker died mid-way)
            shutil.rmtree(root, ignore_errors=True)
        private_dir(root.parent)
        log(f"[fray] building an environment with {' '.join(wanted)} (once per worker; later jobs reuse it)")
        try:
            _build_venv(root, wanted, log)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        write_private(root / _READY, json.dumps({"requirements": wanted}))
        return root


def _fetch(controller: str, token: CredentialLike, digest: str) -> bytes:
    ops = ops_client(controller, token)
    try:
        return ops.get_blob(digest)
    finally:
        ops.close()


def runtime_available() -> str | None:
    """``docker`` or ``podman`` if one is installed here and its engine answers, else None."""
    for runtime in ("docker", "podman"):
        path = shutil.which(runtime)
        if path is None:
            continue
        try:
            done = subprocess.run([path, "info"], capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return runtime
    return None


def container_command(
    runtime: str, image: str, argv: Sequence[str], env: dict[str, str], cwd: str, mounts: Sequence[str]
) -> list[str]:
    """The command that runs ``argv`` in ``image``: host network, ``mounts`` at the same paths, ``env`` passed on.

    Variables are named (``-e NAME``) and their values taken from the runtime's own
    environment, so they never appear on a command line.
    """
    command = [runtime, "run", "--rm", "--init", "--network", "host", "-w", cwd]
    for path in dict.fromkeys(mounts):
        command += ["-v", f"{path}:{path}"]
    for name in sorted(env):
        command += ["-e", name]
    return [*command, image, *argv]


def prepare(
    spec: Any,
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    *,
    workdir: Path,
    controller: str,
    token: CredentialLike,
    log: Callable[[str], None],
) -> Prepared:
    """Make ``spec``'s environment ready and return how to start its task (see the module docstring).

    ``controller`` (``host:port``) and ``token`` (the worker's credential) are where a workspace is fetched from;
    ``log`` puts a line in the task's output (what is being built, and why it waits).
    """
    environment = spec.environment
    digest = getattr(spec, "workspace_digest", "")
    forkable = True
    env = dict(env)
    requirements = list(environment.pip_packages)
    if digest:
        directory = workdir / "workspaces" / digest.replace(":", "-")
        if not directory.is_dir():
            directory = unpack_workspace(_fetch(controller, token, digest), digest, workdir / "workspaces")
        cwd = str(directory)
        paths = [str(directory)] + ([str(directory / "src")] if (directory / "src").is_dir() else [])
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
        forkable = False
        if environment.extras:
            requirements += requirements_of(read_project(directory, spec.name), environment.extras, spec.name)
    elif environment.extras:  # refused at submit; a spec from elsewhere may still say so
        raise EnvironmentFailed(f"extras={list(environment.extras)!r} need the job's workspace, and it has none")
    python = Path(sys.executable)
    if requirements:
        root = pip_environment(requirements, workdir, log)
        python = _venv_python(root)
        env["VIRTUAL_ENV"] = str(root)
        env["PATH"] = os.pathsep.join([str(python.parent), env.get("PATH", os.defpath)])
        if spec.argv is None:
            argv = [str(python), *argv[1:]]
        forkable = False
    if environment.docker_image and spec.argv is None:
        argv = ["python", *argv[1:]]  # the image's interpreter, which must have fray installed
    processes = getattr(spec, "processes_per_task", 1)
    if processes > 1:
        gpus = spec.resources.device_count if spec.resources.device_kind == "gpu" else 0
        failure = argv[-1] if spec.argv is None else None  # a callable's failure file: fray.process._jobmain
        supervisor = "python" if environment.docker_image else str(python)  # in an image, its own (with Fray)
        argv = ranked_argv(argv, processes, python=supervisor, gpus=gpus, failure=failure)
        forkable = False
    if environment.docker_image:
        runtime = os.environ.get("FRAY_CONTAINER_RUNTIME") or runtime_available()
        if runtime is None:
            raise EnvironmentFailed(
                f"docker_image={environment.docker_image!r}: this worker has no container runtime (docker or podman)"
            )
        payload_dirs = [str(Path(a).parent) for a in argv if a.startswith(str(workdir))]
        passed = {k: v for k, v in env.items() if k.startswith("FRAY_") or k in environment.env_vars}
        passed["PYTHONUNBUFFERED"] = "1"
        argv = container_command(runtime, environment.docker_image, argv, passed, cwd, [cwd, *payload_dirs])
        forkable = False
    return Prepared(argv, env, cwd, forkable)
