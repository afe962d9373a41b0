"""marin's own packages in the cached Python 3.12 venv, with *this* Fray as their ``fray``.

marin's code (``marin-core``, ``marin-zephyr``) needs Python >= 3.12 and pins ``marin-fray``,
the fray that marin publishes. To run that code on Fray unchanged, this module adds to the
Iris suite's cached venv (``tests/iris_backend/iris_venv.py``: Python 3.12, ``fray[iris,test]``
installed editable from this checkout) what marin's code needs:

* ``marin-core`` and ``marin-zephyr`` at :data:`MARIN_VERSION`, with ``--no-deps`` (they pin
  ``marin-fray``; without it ``import fray`` stays ours);
* the dependencies of theirs that the code run here imports (:data:`MARIN_DEPENDENCIES`):
  zephyr's own list, and of marin-core's only jax (``marin.execution`` imports it). marin-core
  also depends on levanter, transformers, wandb, torch-sized things its execution layer does not
  import; pip needs more than ten minutes only to resolve them all, so they are left out;
* Ray (``fray[ray]``'s pin), to run marin's code on the Ray backend;
* ``marin-fray`` itself, *not* on the venv's path but in a directory of its own
  (:func:`marin_fray_dir`), which only the signature comparison in
  ``tests/test_marin_compat.py`` puts first on ``PYTHONPATH``.

The additions are made once per built venv, under the Iris venv's lock, and recorded in
``.marin-ready`` (keyed by what is installed), so a venv rebuilt for a new ``pyproject.toml``
gets them again.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "iris_backend"))
from iris_venv import CACHE, ROOT, SUITE_TIMEOUT, VenvBuildError, ensure_venv, find_python312, installer

__all__ = [
    "MARIN_DEPENDENCIES",
    "MARIN_VERSION",
    "ROOT",
    "SUITE_TIMEOUT",
    "VenvBuildError",
    "ensure_marin_venv",
    "find_python312",
    "marin_fray_dir",
]

#: marin's published packages, all at one version (marin releases them together).
MARIN_VERSION = "0.2.227.dev40316220070"
#: What marin's execution layer and zephyr import, from their own requirement lists.
MARIN_DEPENDENCIES = [
    # marin-zephyr's requirements, except marin-fray (ours replaces it) and marin-iris and
    # marin-rigging (already there with fray[iris], at the same version).
    "braceexpand>=0.1.0",
    "click>=8.0",
    "cloudpickle>=3.0",
    "fsspec>=2023.1.0",
    "humanfriendly>=10.0",
    "msgspec>=0.18.0",
    "numpy>=2.0",
    "polars>=1.41.0",
    "psutil>=7.2.2",
    "starlette>=0.50.0",
    "vortex-data>=0.61.0",
    "xxhash>=3.4",
    "zstandard>=0.18.0",
    # marin-core's: marin.execution.step_runner imports jax.
    "jax<0.12,>=0.9.2",
]
# How long adding marin's packages may take (the Ray and jax wheels are large).
INSTALL_TIMEOUT = 20 * 60


def _ray_requirement() -> str:
    """Ray as Fray's ``ray`` extra pins it (one pin, in pyproject.toml)."""
    found = re.search(r'^ray = \["([^"]+)"\]', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    if found is None:
        raise VenvBuildError("pyproject.toml has no `ray = [...]` extra to take Ray's pin from")
    return found.group(1)


def _requirements() -> list[list[str]]:
    """The pip install commands' arguments, in order."""
    return [
        ["--no-deps", f"marin-core=={MARIN_VERSION}", f"marin-zephyr=={MARIN_VERSION}"],
        [_ray_requirement(), *MARIN_DEPENDENCIES],
    ]


def marin_fray_dir(venv: Path) -> Path:
    """The directory holding marin's own ``fray`` (marin-fray), off the venv's path."""
    return venv / "marin-fray"


def ensure_marin_venv(python: str) -> tuple[Path, str]:
    """The Iris venv for ``python`` with marin's packages added; returns it and what was done (with times)."""
    venv, built = ensure_venv(python)
    key = hashlib.sha256(repr(_requirements()).encode()).hexdigest()[:16]
    ready = venv / ".marin-ready"
    if ready.exists() and ready.read_text().split()[0] == key:
        return venv, f"{built}; marin's packages were there"
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one adds them; a second session waits, then finds them
        if ready.exists() and ready.read_text().split()[0] == key:
            return venv, f"{built}; marin's packages were there"
        started = time.monotonic()
        pip = [*installer(venv), "-q"]
        commands = [pip + args for args in _requirements()]
        target = marin_fray_dir(venv)
        commands.append([*pip, "--no-deps", "--upgrade", "--target", str(target), f"marin-fray=={MARIN_VERSION}"])
        log = CACHE / f"{venv.name}-marin.log"
        with log.open("w") as out:
            for command in commands:
                done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT)
                if done.returncode != 0:
                    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                    raise VenvBuildError(f"adding marin's packages to {venv} failed: {' '.join(command)}:\n{tail}")
        took = time.monotonic() - started
        ready.write_text(f"{key} added in {took:.0f}s\n")
    return venv, f"{built}; marin's packages added in {took:.0f}s"
