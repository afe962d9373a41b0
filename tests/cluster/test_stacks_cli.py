"""Live stacks on a Fray cluster beyond the conformance suite: `fray job stack`, `fray actor stack`, and the relay.

Against the session's real cluster (controller and workers as processes): the CLI prints what
``stacks()`` returns; a task process that cannot answer (SIGSTOPped) is reported with its pid
and host within the timeout while the controller keeps answering other calls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fray import ActorConfig, Entrypoint, JobRequest
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster
from support import wait_until

Run = Callable[..., subprocess.CompletedProcess[str]]


def deep_sleep(stop: str) -> None:
    secret_depth = "forty fathoms"  # what --locals must show
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not os.path.exists(stop):
        time.sleep(0.05)
    del secret_depth


class Stuck:
    def __init__(self) -> None:
        self.event = threading.Event()

    def block(self) -> None:
        stuck_here(self.event)

    def release(self) -> None:
        self.event.set()


def stuck_here(event: threading.Event) -> None:
    event.wait(120)


@pytest.fixture
def fray_cli(fray_cluster: LocalCluster, tmp_path: Path) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env.update(HOME=str(tmp_path), FRAY_TOKEN=fray_cluster.token, FRAY_CLIENT_SPEC=f"fray://{fray_cluster.address}")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fray.cli", *args], env=env, capture_output=True, text=True, timeout=120
        )

    return run


@pytest.fixture
def sleeping(cluster_client: ClusterClient, tmp_path: Path, uid: str) -> Iterator[Any]:
    """A running job whose two replicas sleep in ``deep_sleep`` (released at the end)."""
    stop = tmp_path / "stop"
    job = cluster_client.submit(
        JobRequest(
            name=f"cli-deep-{uid}", entrypoint=Entrypoint.from_callable(deep_sleep, args=(str(stop),)), replicas=2
        )
    )
    wait_until(lambda: len(_showing(job.stacks(timeout=5), "deep_sleep")) == 2, timeout=90, what="both replicas")
    yield job
    stop.touch()
    job.terminate()


@pytest.fixture
def uid() -> str:
    import uuid

    return uuid.uuid4().hex[:6]


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0]


def _showing(stacks, function: str) -> list:
    return [p for p in stacks if any(f.function == function for t in p.threads for f in t.frames)]


def test_job_stack_prints_every_replica(fray_cli: Run, sleeping: Any):
    out = fray_cli("job", "stack", sleeping.job_id)
    assert out.returncode == 0, out.stderr
    assert "replica 0 (pid " in out.stdout and "replica 1 (pid " in out.stdout
    assert "in deep_sleep" in out.stdout and "time.sleep(0.05)" in out.stdout
    assert "secret_depth" not in out.stdout

    with_locals = fray_cli("job", "stack", sleeping.job_id, "--locals")
    assert "secret_depth = 'forty fathoms'" in with_locals.stdout

    as_json = json.loads(fray_cli("job", "stack", sleeping.job_id, "--json").stdout)
    assert sorted(p["label"] for p in as_json) == ["replica 0", "replica 1"]
    assert all(p["error"] is None and p["threads"] for p in as_json)


def test_actor_stack_prints_the_blocked_call(fray_cli: Run, cluster_client: ClusterClient, uid: str):
    name = f"cli-stuck-{uid}"
    actor = cluster_client.create_actor(Stuck, name=name, actor_config=ActorConfig(max_concurrency=2))
    call = actor.block.remote()
    try:
        wait_until(lambda: _showing(actor.stacks(timeout=5), "stuck_here"), timeout=60, what="stuck_here")
        out = fray_cli("actor", "stack", name)
        assert out.returncode == 0, out.stderr
        assert f"actor {name!r} (pid " in out.stdout and "in stuck_here" in out.stdout
        namespaced = fray_cli("actor", "stack", name, "--namespace", cluster_client.namespace, "--json")
        assert [p["label"] for p in json.loads(namespaced.stdout)] == [f"actor {name!r}"]
    finally:
        actor.release()
        call.result(timeout=60)


def test_stack_of_what_does_not_run_is_one_error_and_a_hint(fray_cli: Run, cluster_client: ClusterClient, uid: str):
    out = fray_cli("actor", "stack", f"nobody-{uid}")
    assert out.returncode == 2 and f"error: no running actor 'nobody-{uid}'" in out.stderr and "hint: " in out.stderr
    assert "Traceback" not in out.stderr
    job = cluster_client.submit(JobRequest(name=f"done-{uid}", entrypoint=Entrypoint.from_binary("true")))
    job.wait(timeout=60)
    out = fray_cli("job", "stack", job.job_id)
    assert out.returncode == 2 and "is succeeded: no process of it runs" in out.stderr and "hint: " in out.stderr


def test_a_stopped_task_process_is_reported_and_the_controller_stays_responsive(
    sleeping: Any,
):
    job = sleeping
    first = _showing(job.stacks(timeout=5), "deep_sleep")[0]
    assert first.pid is not None
    os.kill(first.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: _state(first.pid) == "T", timeout=10, what="the process to stop")
        answers: list = []
        asking = threading.Thread(target=lambda: answers.append(job.stacks(timeout=3)))
        started = time.monotonic()
        asking.start()
        # While the request waits for the stopped process, the controller answers others at once.
        assert job.status().value == "running"
        assert asking.is_alive() and time.monotonic() - started < 2.5
        asking.join(30)
        assert answers, "stacks() did not return"
        assert time.monotonic() - started < 3 + 2 + 5
        stopped = [p for p in answers[0] if p.pid == first.pid]
        assert stopped and stopped[0].error and "did not answer within 3 s" in stopped[0].error
        assert f"pid {first.pid} on host" in stopped[0].error and not stopped[0].threads
        assert _showing(answers[0], "deep_sleep"), "the other replica still answers"
    finally:
        os.kill(first.pid, signal.SIGCONT)


def test_only_a_jobs_owner_reads_its_stacks_and_only_workers_answer(fray_cluster: LocalCluster, sleeping: Any):
    from fray import PermissionDenied
    from fray.cluster.protocol.controller_client import controller_client
    from fray.cluster.protocol.credentials import WORKER, Credential, user_principal

    master = fray_cluster.token.encode()
    mallory = controller_client(fray_cluster.address, Credential.mint(master, user_principal("mallory")))
    with pytest.raises(PermissionDenied, match="only they may read its stacks"):
        mallory.job_stacks(sleeping.job_id, 1.0)
    with pytest.raises(PermissionDenied, match="worker credential"):
        mallory.stacks_answer("worker-0", 1, 1, [])
    # A worker credential may answer, but an answer nobody asked for (or from an ended epoch) is dropped.
    worker = controller_client(fray_cluster.address, Credential.mint(master, WORKER))
    assert worker.stacks_answer("worker-0", 10**6, 10**6, []) is False
