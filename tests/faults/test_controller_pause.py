"""A controller stopped longer than the worker timeout (SIGSTOP: a GC or swap stall, a VM pause) does not
declare every worker lost on resume: each gets a full timeout from the resume (issue 23)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray import Entrypoint, JobRequest, JobStatus
from fray.cluster.client import ClusterJobHandle
from fray.cluster.protocol.controller_client import ControllerProxy, controller_client
from fray.cluster.protocol.records import WorkerRecord, WorkerState
from fray.cluster.server.launcher import LocalCluster
from support import alive, wait_until

from .helpers import gated_then_mark, lines, wait_lines, with_workers

# The fixture's worker timeout is 2 s: the workers' lease (self-stop) is 1.5 s, the pause 3 x the timeout.
PAUSE_TIMEOUTS = 3.0


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[ControllerProxy]:
    client = controller_client(cluster.address, cluster.token)
    yield client
    client.close()


def _workers(admin: ControllerProxy) -> dict[str, WorkerRecord]:
    return {w.info.worker_id: w for w in admin.list_workers()}


def _submit_two(cluster: LocalCluster, tmp_path: Path) -> tuple[list[ClusterJobHandle], list[list[str]]]:
    """Two gated jobs, one on each of two one-core workers; return them and their first start lines."""
    client = with_workers(cluster, 1, 1)
    jobs = [
        client.submit(
            JobRequest(
                name=f"j{i}",
                entrypoint=Entrypoint.from_callable(gated_then_mark, args=(str(tmp_path),)),
                max_retries_preemption=5,
            )
        )
        for i in range(2)
    ]
    first = [wait_lines(tmp_path / f"j{i}.started", 1, f"job j{i} to start")[0].split() for i in range(2)]
    assert {line[1] for line in first} == {"w-a", "w-b"}, first
    return jobs, first


def _pause_controller(cluster: LocalCluster, tasks_to_stop: list[int], during: object = None) -> float:
    """SIGSTOP the controller for PAUSE_TIMEOUTS x the timeout; return the monotonic time of the SIGCONT.

    The workers' tasks must stop on their own meanwhile (their lease runs out 0.75 x the timeout
    after the last contact), which the pause waits for before it ends.
    """
    assert cluster.controller is not None
    stopped_at = time.monotonic()
    cluster.controller.send_signal(signal.SIGSTOP)
    try:
        if callable(during):
            during()
        for pid in tasks_to_stop:
            wait_until(lambda pid=pid: not alive(pid), timeout=30, what=f"task {pid} to be stopped by its worker")
        # The pause is the fault being injected: hold it for its full length.
        time.sleep(max(0.0, PAUSE_TIMEOUTS * cluster.worker_timeout - (time.monotonic() - stopped_at)))
    finally:
        cluster.controller.send_signal(signal.SIGCONT)
    return time.monotonic()


def _finish_exactly_once(tmp_path: Path, jobs: list[ClusterJobHandle]) -> None:
    (tmp_path / "go").touch()
    for i, job in enumerate(jobs):
        assert job.wait(timeout=90) == JobStatus.SUCCEEDED
        done = lines(tmp_path / f"j{i}.done")
        assert len(done) == 1, f"j{i} completed {len(done)} times: {done}"
        attempts = [line.split()[0] for line in lines(tmp_path / f"j{i}.started")]
        assert attempts == sorted(set(attempts)), f"j{i}: an attempt started twice: {attempts}"
        assert done[0].split()[0] == attempts[-1], "the completion came from a superseded attempt"
        # One new attempt for the stopped (or lost) one: none started under the lapsed lease and burnt.
        assert attempts == ["0", "1"] and job.view().attempt == 1, f"j{i} attempts: {attempts}"


@pytest.mark.slow
def test_a_paused_controller_declares_no_worker_lost_on_resume(
    cluster: LocalCluster, admin: ControllerProxy, tmp_path: Path
) -> None:
    jobs, first = _submit_two(cluster, tmp_path)
    cluster.add_worker("w-c", "--cpu", "1")  # and an idle one, whose only call is its long-poll
    cluster.wait_for_workers(3)
    before = _workers(admin)
    resumed_wall = time.time() + (_pause_controller(cluster, [int(line[2]) for line in first]) - time.monotonic())

    # Judge only once the controller has heard every worker after the grace it gave them ran out:
    # before the fix it declared both lost on its first pass after the resume.
    def heard_after_grace() -> dict[str, WorkerRecord] | None:
        now = _workers(admin)
        late = resumed_wall + cluster.worker_timeout + 0.5
        return now if all(w.last_heartbeat > late or w.state != WorkerState.ALIVE for w in now.values()) else None

    after = wait_until(heard_after_grace, timeout=60, what="every worker to be heard after the grace")
    for worker_id, record in before.items():
        assert after[worker_id].state == WorkerState.ALIVE, f"{worker_id} was declared lost for the controller's pause"
        assert after[worker_id].epoch == record.epoch, f"{worker_id} was declared lost and re-registered"

    # The controller says why it forgave them; on a loaded machine its pass may come after the heartbeats above.
    def stall_logged() -> str | None:
        text = (cluster.directory / "controller.log").read_text(errors="replace")
        return text if "the controller stood still for" in text else None

    log = wait_until(stall_logged, timeout=30, what="the controller to log the stall it forgave")
    assert "is lost: no heartbeat" not in log

    # Each worker stopped its task on its own during the pause (its lease); the controller heard it
    # on resume and gave the job a new attempt, which completes once.
    for i in range(2):
        wait_lines(tmp_path / f"j{i}.started", 2, f"job j{i} to get its new attempt")
    _finish_exactly_once(tmp_path, jobs)
    assert {w: r.epoch for w, r in _workers(admin).items()} == {w: r.epoch for w, r in before.items()}


@pytest.mark.slow
def test_a_worker_that_dies_during_the_pause_is_the_only_one_lost_after_the_grace(
    cluster: LocalCluster, admin: ControllerProxy, tmp_path: Path
) -> None:
    jobs, first = _submit_two(cluster, tmp_path)
    before = _workers(admin)
    resumed = _pause_controller(cluster, [int(line[2]) for line in first], lambda: cluster.kill_worker("w-b"))

    lost = wait_until(
        lambda: _workers(admin)["w-b"].state == WorkerState.LOST, timeout=60, what="the dead worker to be lost"
    )
    lost_after = time.monotonic() - resumed
    assert lost
    assert lost_after >= 0.9 * cluster.worker_timeout, f"w-b was lost {lost_after:.2f}s after the resume: no grace"
    survivor = _workers(admin)["w-a"]
    assert survivor.state == WorkerState.ALIVE and survivor.epoch == before["w-a"].epoch
    log = (cluster.directory / "controller.log").read_text(errors="replace")
    assert "worker w-a is lost" not in log and "worker w-b is lost: no heartbeat" in log

    # Both jobs now need the one core of w-a: released, they run there one after the other, each once.
    _finish_exactly_once(tmp_path, jobs)
    for i in range(2):
        assert lines(tmp_path / f"j{i}.done")[0].split()[1] == "w-a"
    print(
        f"\nw-b declared lost {lost_after:.2f}s after the controller resumed (worker timeout {cluster.worker_timeout}s)"
    )
