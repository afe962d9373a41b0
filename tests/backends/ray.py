"""Fixtures for the Ray backend: one real local Ray per test session, a fresh client per test.

Starting Ray costs seconds, so ``ray_cluster`` starts it once (session scope) with the
job-submission server that binary jobs need (it lives in Ray's dashboard process).
``ray_client`` is then cheap: it attaches to that connection in a namespace of its
own, so actor names never collide between tests, and its shutdown kills the test's
actors and jobs, so a long session does not pile up idle actor processes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Logical CPUs: Ray schedules on these, not on the machine's cores. Enough for the
# conformance suite's concurrent jobs and actors (each takes one by default).
RAY_TEST_CPUS = 8


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A local Ray started once for the whole session (skips if Ray is not installed)."""
    ray = pytest.importorskip("ray", reason='the Ray backend needs Ray: pip install "fray[ray]"')
    if ray.is_initialized():  # someone else's session: reuse it, leave it running
        yield ray
        return
    # Test modules are imported from tests/ directories that pytest put on sys.path;
    # Ray's worker processes inherit the environment of the raylet started here, so
    # they can import the same modules when they unpickle test classes and functions.
    tests_dir = str(Path(__file__).resolve().parents[1])
    paths = [p for p in sys.path if p.startswith(tests_dir)]
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *([before] if before else [])])
    ray.init(
        address="local",
        num_cpus=RAY_TEST_CPUS,
        include_dashboard=True,  # hosts the job-submission server used by binary jobs
        log_to_driver=False,  # job output is checked through Fray's logs(), not the driver's stderr
        configure_logging=False,
    )
    if before is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = before
    stop = threading.Event()
    threading.Thread(
        target=_watch_head_processes, args=(ray._private.worker._global_node, stop), name="ray-head-watch", daemon=True
    ).start()
    try:
        yield ray
    finally:
        stop.set()
        ray.shutdown()


@pytest.fixture
def ray_client(ray_cluster: Any) -> Iterator[Any]:
    """A RayClient on the session's Ray, in a namespace of its own; shut down after the test."""
    from fray.ray import RayClient

    client = RayClient(namespace=f"test-{uuid.uuid4().hex[:8]}")
    yield client
    client.shutdown(wait=False)


# ----- a loud end instead of a silent one -------------------------------------------------------
# When the GCS of the session's Ray dies, Ray ends this process 60 s later with exit code 1 and
# nothing printed (its C++ client gives up reconnecting); pytest's capture swallows Ray's own
# words. The watcher reports such a death at once, on the stderr pytest had before capturing.

_AFTERMATH = {
    "gcs_server": "Ray ends this test process about 60 s later, printing nothing",
    "raylet": "every later Ray call of this session fails with LocalRayletDiedError",
}
_REAL_STDERR: int | None = None
_current_test = "(between tests)"


def pytest_configure(config: pytest.Config) -> None:
    global _REAL_STDERR
    _REAL_STDERR = os.dup(2)


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    global _current_test
    _current_test = nodeid


def _watch_head_processes(node: Any, stop: threading.Event) -> None:
    """Report on the real stderr when the GCS or raylet of the session's Ray exits."""
    watched = {name: info.process for name in ("gcs_server", "raylet") for info in node.all_processes.get(name, [])}
    logs = Path(node.get_logs_dir_path())
    while watched and not stop.wait(1.0):
        for name, process in list(watched.items()):
            code = process.poll()
            if code is None or stop.is_set():
                continue
            del watched[name]  # reported once
            then = _AFTERMATH[name]
            lines = [
                f"\n!!! the session's Ray {name} (pid {process.pid}) exited with code {code} at "
                f"{time.strftime('%H:%M:%S')}, during {_current_test}; {then}. Its logs end:",
                _machine_state(logs),
            ]
            for log in sorted(logs.glob(f"{name}.*")):
                with open(log, errors="replace") as file:
                    tail = file.readlines()[-25:]
                lines += [f"--- {log}", *(line.rstrip() for line in tail)]
            if _REAL_STDERR is not None:
                os.write(_REAL_STDERR, ("\n".join(lines) + "\n").encode())


def _machine_state(logs: Path) -> str:
    """Memory and the space left where Ray writes: the usual suspects when a Ray process dies."""
    import psutil

    memory = psutil.virtual_memory()
    disk = psutil.disk_usage(str(logs))
    return (
        f"memory available {memory.available / 2**30:.1f} of {memory.total / 2**30:.1f} GiB; "
        f"{disk.free / 2**30:.1f} GiB free on the disk of {logs}"
    )
