"""The faults a Fray cluster must survive, each with real controller, worker and task processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray import (
    ActorDiedError,
    ActorUnavailableError,
    Entrypoint,
    JobFailed,
    JobRequest,
    JobStatus,
    ResourceConfig,
    current_client,
    current_job,
)
from fray.cluster.client import ClusterClient
from fray.cluster.rpc import AuthenticationError
from fray.cluster.server.launcher import LocalCluster
from support import alive, wait_until


def _cluster(tmp_path: Path, worker_timeout: float) -> Iterator[LocalCluster]:
    tests_dir = str(Path(__file__).resolve().parents[1])
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p.startswith(tests_dir))}
    with LocalCluster(tmp_path / "cluster", worker_timeout=worker_timeout, env=env) as c:
        c.start_controller()
        yield c


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    yield from _cluster(tmp_path, 2.0)


@pytest.fixture
def patient_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A 30 s worker timeout: a controller restart must fit in the workers' lease (0.75 x: 22.5 s). One on a
    loaded 2-core machine took longer than 7.5 s (its workers then stop their tasks, as in a partition)."""
    yield from _cluster(tmp_path, 30.0)


def client_of(cluster: LocalCluster) -> ClusterClient:
    return ClusterClient(cluster.address, token=cluster.token)


def with_workers(cluster: LocalCluster, *cpus: int | None) -> ClusterClient:
    """Start workers ``w-a``, ``w-b``, ... offering these many cores (None: the machine's); return a client."""
    for letter, cpu in zip("abcdefgh", cpus, strict=False):
        cluster.add_worker(f"w-{letter}", *(("--cpu", str(cpu)) if cpu is not None else ()))
    cluster.wait_for_workers(len(cpus))
    return client_of(cluster)


def wait_for_file(path: Path, timeout: float = 30.0) -> None:
    """Inside a job: block until ``path`` exists (the test's way to hold a job running)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


def write_atomically(path: Path, text: str) -> None:
    """Inside a job: write ``path`` so that a reader never sees it half-written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def record_and_block_first_attempt(directory: str) -> None:
    info = current_job()
    assert info is not None
    marker = Path(directory) / f"attempt-{info.attempt}-replica-{info.replica_index}"
    write_atomically(marker, f"{os.environ['FRAY_WORKER_ID']} {os.getpid()}")
    if info.attempt == 0:
        time.sleep(300)


def test_killed_worker_mid_task_the_job_succeeds_elsewhere(cluster: LocalCluster, tmp_path: Path):
    client = with_workers(cluster, 1, 1)
    job = client.submit(
        JobRequest(
            name="survivor", entrypoint=Entrypoint.from_callable(record_and_block_first_attempt, args=(str(tmp_path),))
        )
    )
    first = tmp_path / "attempt-0-replica-0"
    wait_until(first.exists, what="the first attempt to start")
    worker_id, pid = first.read_text().split()
    cluster.kill_worker(worker_id)
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    second_worker = (tmp_path / "attempt-1-replica-0").read_text().split()[0]
    assert second_worker != worker_id
    wait_until(lambda: not alive(int(pid)), what="the dead worker's task to die with it")


def gated(directory: str) -> None:
    wait_for_file(Path(directory) / "go", timeout=120)


def test_killed_controller_restarts_and_nothing_is_lost(patient_cluster: LocalCluster, tmp_path: Path):
    cluster = patient_cluster
    client = with_workers(cluster, 1)
    running = client.submit(
        JobRequest(name="running", entrypoint=Entrypoint.from_callable(gated, args=(str(tmp_path),)))
    )
    queued = client.submit(JobRequest(name="queued", entrypoint=Entrypoint.from_callable(gated, args=(str(tmp_path),))))
    wait_until(lambda: running.status() == JobStatus.RUNNING, what="the first job to run")
    assert queued.status() == JobStatus.PENDING  # one cpu: the second waits
    cluster.kill_controller()
    cluster.start_controller()
    (tmp_path / "go").touch()
    assert running.wait(timeout=60) == JobStatus.SUCCEEDED
    assert queued.wait(timeout=60) == JobStatus.SUCCEEDED
    assert running.view().attempt == 0  # it kept running through the restart, it was not re-run
    assert cluster.workers["w-a"].poll() is None  # the worker rode out the restart


class Pid:
    def pid(self) -> int:
        return os.getpid()


def test_killed_actor_process_surfaces_to_callers_and_group(cluster: LocalCluster):
    client = with_workers(cluster, None)
    group = client.create_actor_group(Pid, name="victim", count=2)
    handles = group.wait_ready(timeout=60)
    pid = handles[0].pid()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises((ActorDiedError, ActorUnavailableError)):
        handles[0].pid()
    wait_until(lambda: group.statuses()[0] == JobStatus.FAILED, what="the group to show the dead member")
    assert group.statuses()[1] == JobStatus.RUNNING
    assert handles[1].pid() != pid
    with pytest.raises(ActorDiedError):
        handles[0].pid()


def exit_with(code: int) -> None:
    os._exit(code)


def test_nonzero_exit_with_and_without_retry_budget(cluster: LocalCluster, tmp_path: Path):
    client = with_workers(cluster, None)
    no_budget = client.submit(JobRequest(name="once", entrypoint=Entrypoint.from_binary("bash", ["-c", "exit 7"])))
    with pytest.raises(JobFailed) as info:
        no_budget.wait(timeout=60)
    assert info.value.exit_code == 7
    script = f"if [ -f {tmp_path}/ran ]; then exit 0; fi; touch {tmp_path}/ran; exit 5"
    with_budget = client.submit(
        JobRequest(name="twice", entrypoint=Entrypoint.from_binary("bash", ["-c", script]), max_retries_failure=1)
    )
    assert with_budget.wait(timeout=60) == JobStatus.SUCCEEDED
    assert with_budget.view().attempt == 1


def gang_member(directory: str) -> None:
    info = current_job()
    assert info is not None
    write_atomically(Path(directory) / f"attempt-{info.attempt}-replica-{info.replica_index}", str(os.getpid()))
    if info.attempt == 0:
        if info.replica_index == 1:
            wait_for_file(Path(directory) / "attempt-0-replica-0")
            os._exit(3)
        time.sleep(300)


def test_gang_is_retried_together_when_one_replica_dies(cluster: LocalCluster, tmp_path: Path):
    client = with_workers(cluster, 4)
    job = client.submit(
        JobRequest(
            name="gang",
            entrypoint=Entrypoint.from_callable(gang_member, args=(str(tmp_path),)),
            replicas=2,
            max_retries_failure=1,
        )
    )
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    survivor = int((tmp_path / "attempt-0-replica-0").read_text())
    wait_until(lambda: not alive(survivor), what="the sleeping replica of the failed gang to be stopped")
    assert (tmp_path / "attempt-1-replica-0").exists() and (tmp_path / "attempt-1-replica-1").exists()


def test_unsatisfiable_job_stays_pending_with_its_reason_and_can_be_terminated(cluster: LocalCluster):
    client = with_workers(cluster, 2)
    job = client.submit(
        JobRequest(name="huge", entrypoint=Entrypoint.from_binary("true"), resources=ResourceConfig(cpu=64))
    )
    reason = wait_until(job.pending_reason, what="a pending reason")
    assert "can never be scheduled" in reason
    assert job.status() == JobStatus.PENDING
    job.terminate()
    assert job.wait(timeout=30) == JobStatus.STOPPED


def parent_with_child(directory: str) -> None:
    child = current_client().submit(
        JobRequest(
            name="child",
            entrypoint=Entrypoint.from_binary("bash", ["-c", f"echo $$ > {directory}/child; exec sleep 300"]),
        )
    )
    wait_for_file(Path(directory) / "child")
    Path(directory, "child-id").write_text(child.job_id)


def test_child_jobs_stop_when_their_parent_ends(cluster: LocalCluster, tmp_path: Path):
    client = with_workers(cluster, 4)
    parent = client.submit(
        JobRequest(name="parent", entrypoint=Entrypoint.from_callable(parent_with_child, args=(str(tmp_path),)))
    )
    assert parent.wait(timeout=60) == JobStatus.SUCCEEDED
    child_id = (tmp_path / "child-id").read_text()
    assert child_id.startswith(parent.job_id + "/child-")
    from fray.cluster.client import ClusterJobHandle

    child = ClusterJobHandle(cluster.address, child_id, cluster.token.encode())
    assert child.wait(timeout=30) == JobStatus.STOPPED
    pid = int((tmp_path / "child").read_text())
    wait_until(lambda: not alive(pid), what="the child's process to be killed")


def test_wrong_token_is_refused(cluster: LocalCluster):
    with pytest.raises(AuthenticationError):
        ClusterClient(cluster.address, token="not-the-token").submit(
            JobRequest(name="intruder", entrypoint=Entrypoint.from_binary("true"))
        )


def test_short_tasks_finish_while_a_long_one_runs_beside_them(cluster: LocalCluster, tmp_path: Path):
    # Regression: tasks forked together must not hold each other's output pipes open.
    client = with_workers(cluster, 64)
    long_job = client.submit(JobRequest(name="long", entrypoint=Entrypoint.from_callable(gated, args=(str(tmp_path),))))
    short = [
        client.submit(JobRequest(name=f"short-{i}", entrypoint=Entrypoint.from_callable(print, args=(i,))))
        for i in range(20)
    ]
    assert [job.wait(timeout=60) for job in short] == [JobStatus.SUCCEEDED] * 20
    assert long_job.status() == JobStatus.RUNNING
    (tmp_path / "go").touch()
    assert long_job.wait(timeout=60) == JobStatus.SUCCEEDED


def test_a_drivers_actors_stop_when_it_exits_but_its_jobs_run_on(cluster: LocalCluster, tmp_path: Path):
    with_workers(cluster, 4)
    script = f"""
import os
from fray import Entrypoint, JobRequest
from fray.cluster.client import ClusterClient
class Pid:
    def pid(self):
        return os.getpid()
client = ClusterClient({cluster.address!r}, token={cluster.token!r})
actor = client.create_actor(Pid, name="driver-actor")
actor.pid()
job = client.submit(JobRequest(name="keeps-running", entrypoint=Entrypoint.from_binary("sleep", ["300"])))
print(job.job_id)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    views = {v.name: v for v in client_of(cluster)._controller.list_jobs()}
    assert views["driver-actor"].state == JobStatus.STOPPED
    assert views["keeps-running"].state == JobStatus.RUNNING
    assert views["keeps-running"].job_id == out.stdout.strip()


def test_a_lost_worker_that_comes_back_has_its_stale_tasks_killed(cluster: LocalCluster, tmp_path: Path):
    client = with_workers(cluster, 1, 1)
    job = client.submit(
        JobRequest(
            name="partitioned",
            entrypoint=Entrypoint.from_callable(record_and_block_first_attempt, args=(str(tmp_path),)),
        )
    )
    first = tmp_path / "attempt-0-replica-0"
    wait_until(first.exists, what="the first attempt to start")
    worker_id, pid = first.read_text().split()
    frozen = cluster.workers[worker_id]
    frozen.send_signal(signal.SIGSTOP)  # a network partition, as the controller sees it
    try:
        assert job.wait(timeout=60) == JobStatus.SUCCEEDED  # rescheduled on the other worker
        # Fenced: the frozen worker's lease expired, so its task did not run on beside the new one.
        assert not alive(int(pid))
    finally:
        frozen.send_signal(signal.SIGCONT)

    def rejoined() -> bool:
        return any(w.info.worker_id == worker_id and w.info.alive for w in client._controller.list_workers())

    wait_until(rejoined, what="the worker to rejoin")


def pid_then_loop(directory: str) -> None:
    info = current_job()
    assert info is not None
    write_atomically(Path(directory) / info.job_id, str(os.getpid()))
    while True:
        time.sleep(0.01)


def test_terminate_right_after_submit_never_leaves_a_task_running(cluster: LocalCluster, tmp_path: Path):
    # Terminate at every stage of a task's start (unsent, just forked, running). Seen once
    # under load: a kill reaching a forked task before it had its own process group was
    # lost and the task ran on; the window is too short to hit on purpose.
    client = with_workers(cluster, 8)
    pids = tmp_path / "pids"
    pids.mkdir()
    for i in range(15):
        job = client.submit(
            JobRequest(name=f"quick-{i}", entrypoint=Entrypoint.from_callable(pid_then_loop, args=(str(pids),)))
        )
        if i % 3:
            wait_until(lambda job=job: job.status() == JobStatus.RUNNING, what="the job to be placed")
        job.terminate()
        assert job.wait(timeout=30) == JobStatus.STOPPED
    for pidfile in pids.iterdir():
        pid = int(pidfile.read_text())
        wait_until(lambda pid=pid: not alive(pid), what=f"task {pidfile.name} to be gone")
