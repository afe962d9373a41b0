"""Exact actor groups and actors that reserve nothing by default, on every backend."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fray import ActorDiedError, Entrypoint, JobRequest, JobStatus, ResourceConfig, current_actor, wait_all
from support import wait_until


class Gated:
    """Members whose index is below ``slow_below`` wait in their constructor until ``gate`` exists."""

    def __init__(self, gate: str, slow_below: int) -> None:
        self.index = current_actor().index
        if self.index < slow_below:
            wait_until_exists(Path(gate))

    def which(self) -> int:
        return self.index


def wait_until_exists(path: Path) -> None:
    deadline = time.monotonic() + 300
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


class BadMember:
    def __init__(self, broken: int) -> None:
        if current_actor().index == broken:
            raise ValueError(f"member {broken} has no config")

    def ping(self) -> str:
        return "pong"


class Idle:
    def ping(self) -> int:
        return os.getpid()


def test_wait_ready_returns_exactly_the_first_k_ready_then_discover_new(client, uid, tmp_path):
    gate = tmp_path / "gate"
    group = client.create_actor_group(Gated, str(gate), 2, name=f"exact-{uid}", count=4)
    first = group.wait_ready(count=2, timeout=120)
    assert [h.which() for h in first] == [2, 3]  # the first two ready, in member order
    assert group.discover_new() == []
    assert not group.is_done()
    gate.write_text("open")
    found: list = []
    wait_until(lambda: found.extend(group.discover_new()) or len(found) == 2, timeout=120, what="the slow members")
    assert sorted(h.which() for h in found) == [0, 1]
    assert group.discover_new() == []
    assert len(group.wait_ready(timeout=120)) == 4


def test_wait_ready_never_returns_more_than_asked(client, uid, tmp_path):
    gate = tmp_path / "gate"
    gate.write_text("open")
    group = client.create_actor_group(Gated, str(gate), 0, name=f"few-{uid}", count=3)
    group.wait_ready(timeout=120)
    assert len(group.wait_ready(count=1, timeout=120)) == 1
    assert len(group.wait_ready(count=0, timeout=120)) == 0


def test_constructor_failure_fails_wait_ready_at_once_naming_the_member(client, uid):
    group = client.create_actor_group(BadMember, 1, name=f"bad-{uid}", count=3)
    with pytest.raises(ActorDiedError, match="member 1") as info:
        group.wait_ready(timeout=120)
    assert isinstance(info.value.__cause__, ValueError)
    assert "member 1 has no config" in str(info.value)


def test_a_failed_constructor_keeps_the_users_exception_type(client, uid):
    # As a failed job's JobFailed is also the job's own exception: `except ValueError` works on every backend.
    group = client.create_actor_group(BadMember, 1, name=f"typed-{uid}", count=2)
    with pytest.raises(ValueError, match="member 1 has no config") as info:
        group.wait_ready(timeout=120)
    assert isinstance(info.value, ActorDiedError)
    member = group.handles[1]
    with pytest.raises(ValueError, match="member 1 has no config") as call:
        member.ping()
    assert isinstance(call.value, ActorDiedError)


def test_constructor_failure_fails_even_a_reachable_count(client, uid):
    group = client.create_actor_group(BadMember, 0, name=f"bad0-{uid}", count=2)
    wait_until(lambda: JobStatus.FAILED in group.statuses(), timeout=120, what="member 0 to fail")
    with pytest.raises(ActorDiedError, match="member 0"):
        group.wait_ready(count=1, timeout=120)


def test_is_done_once_every_member_finished(client, uid):
    group = client.create_actor_group(Idle, name=f"done-{uid}", count=2)
    group.wait_ready(timeout=120)
    assert not group.is_done()
    group.shutdown()
    for job in group.jobs:
        job.wait(timeout=120, raise_on_failure=False)
    assert group.is_done()


def test_default_actors_reserve_nothing_so_many_fit(client, uid):
    singles = [client.create_actor(Idle, name=f"free-{uid}-{i}") for i in range(8)]
    group = client.create_actor_group(Idle, name=f"freegroup-{uid}", count=4)
    members = group.wait_ready(timeout=300)
    assert all(isinstance(actor.ping.remote().result(timeout=300), int) for actor in singles + members)


# ----- the seeds' RL pattern ------------------------------------------------------------------


class Curriculum:
    def __init__(self) -> None:
        self.issued = 0

    def next_task(self) -> int:
        self.issued += 1
        return self.issued


class WeightCoordinator:
    def __init__(self) -> None:
        self.version = 0
        self.reports: list[tuple[int, int]] = []

    def weights(self) -> int:
        return self.version

    def publish(self) -> int:
        self.version += 1
        return self.version

    def report(self, worker: int, reward: int) -> None:
        self.reports.append((worker, reward))

    def total_reports(self) -> int:
        return len(self.reports)


class Rollout:
    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        self.index = current_actor().index

    def run(self, task: int) -> int:
        return task * 10 + self.coordinator.weights()


def rollout_job(worker: int, curriculum, coordinator, rollout) -> None:
    for _ in range(3):
        task = curriculum.next_task()
        coordinator.report(worker, rollout.run(task))


def run_rl_pattern(client, uid: str) -> None:
    """Two singleton actors, a group of four, and four jobs that call them: all with default resources."""
    curriculum = client.create_actor(Curriculum, name=f"curriculum-{uid}")
    coordinator = client.create_actor(WeightCoordinator, name=f"weights-{uid}")
    rollouts = client.create_actor_group(Rollout, coordinator, name=f"rollout-{uid}", count=4)
    workers = rollouts.wait_ready(timeout=300)
    coordinator.publish()
    jobs = [
        client.submit(
            JobRequest(
                name=f"rl-{uid}-{i}",
                entrypoint=Entrypoint.from_callable(rollout_job, args=(i, curriculum, coordinator, workers[i])),
                resources=ResourceConfig(cpu=0.5),
            )
        )
        for i in range(4)
    ]
    assert wait_all(jobs, timeout=300) == [JobStatus.SUCCEEDED] * 4
    assert coordinator.total_reports() == 12
    assert curriculum.next_task() == 13


def test_rl_pattern_runs_with_default_resources(client, uid):
    run_rl_pattern(client, uid)
