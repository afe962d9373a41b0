"""Job environments on Ray: pip_packages become Ray's runtime_env, so the job imports a package this process lacks.

Needs PyPI (Ray builds the environment with pip on first use)."""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import pytest

from fray.job import Entrypoint, EnvironmentConfig, JobRequest

PACKAGE = "inflection"


def camelize(word: str) -> None:
    import inflection

    print(inflection.camelize(word))


def test_pip_packages_are_installed_for_the_job(ray_client: Any):
    if importlib.util.find_spec(PACKAGE) is not None:
        pytest.skip(f"{PACKAGE} is installed here, so the test would prove nothing")
    env = EnvironmentConfig(pip_packages=[PACKAGE])
    timings = []
    for name in ("ray-pip-1", "ray-pip-2"):
        started = time.monotonic()
        job = ray_client.submit(
            JobRequest(name=name, entrypoint=Entrypoint.from_callable(camelize, args=("on_ray",)), environment=env)
        )
        job.wait(timeout=900)
        timings.append(time.monotonic() - started)
        assert "OnRay" in job.logs()
    started = time.monotonic()
    ray_client.submit(JobRequest(name="ray-plain", entrypoint=Entrypoint.from_callable(print, args=("x",)))).wait(
        timeout=120
    )
    plain = time.monotonic() - started
    print(
        f"\nRay, submit -> done: first job with {PACKAGE} {timings[0]:.2f}s (Ray builds the environment), "
        f"second {timings[1]:.2f}s (cached), a job without pip_packages {plain:.2f}s"
    )
