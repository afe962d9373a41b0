"""Actor and actor-group behaviour every backend must show."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from fray import (
    ActorDiedError,
    ActorFuture,
    ActorUnavailableError,
    Entrypoint,
    JobAlreadyExists,
    JobRequest,
    JobStatus,
    ResourceConfig,
    SerializationError,
    current_client,
    current_job,
)


class Counter:
    """A stateful actor: the classic."""

    def __init__(self, start: int = 0) -> None:
        self.value = start
        self.log: list[int] = []

    def add(self, amount: int = 1) -> int:
        self.value += amount
        self.log.append(amount)
        return self.value

    def history(self) -> list[int]:
        return list(self.log)

    async def async_value(self) -> int:
        return self.value

    def fail(self, message: str) -> None:
        raise KeyError(message)

    def whoami(self) -> tuple[str, str]:
        info = current_job()
        assert info is not None
        return info.name, type(current_client()).__name__


class BrokenAtBirth:
    def __init__(self) -> None:
        raise RuntimeError("cannot start: missing config")

    def ping(self) -> str:
        return "pong"


def bump_counter(counter, times: int) -> None:
    for _ in range(times):
        counter.add(1)


def test_create_actor_returns_a_working_handle(client, uid):
    counter = client.create_actor(Counter, 10, name=f"counter-{uid}")
    assert counter.add(5) == 15
    future = counter.add.remote(1)
    assert isinstance(future, ActorFuture)
    assert future.result(timeout=60) == 16


def test_calls_run_one_at_a_time_in_order(client, uid):
    counter = client.create_actor(Counter, name=f"counter-{uid}")
    futures = [counter.add.remote(i) for i in range(200)]
    results = [f.result(timeout=60) for f in futures]
    assert counter.history() == list(range(200))
    expected, total = [], 0
    for i in range(200):
        total += i
        expected.append(total)
    assert results == expected


def test_constructor_keyword_arguments_and_non_preemptible_placement(client, uid):
    counter = client.create_actor(
        Counter, name=f"pinned-{uid}", start=41, resources=ResourceConfig(cpu=0, preemptible=False)
    )
    assert counter.add(1) == 42


def test_future_reports_done(client, uid):
    counter = client.create_actor(Counter, name=f"done-{uid}")
    future = counter.add.remote(2)
    assert future.result(timeout=60) == 2
    assert future.done()


def test_unknown_method_raises_attribute_error_at_once(client, uid):
    counter = client.create_actor(Counter, name=f"counter-{uid}")
    with pytest.raises(AttributeError, match="Counter"):
        counter.no_such_method  # noqa: B018 - the attribute access itself must raise
    with pytest.raises(AttributeError):
        counter._private_state  # noqa: B018


def test_method_exception_keeps_its_type(client, uid):
    counter = client.create_actor(Counter, name=f"counter-{uid}")
    with pytest.raises(KeyError, match="lost key"):
        counter.fail("lost key")
    with pytest.raises(KeyError):
        counter.fail.remote("again").result(timeout=60)
    assert counter.add(1) == 1  # the actor survives its method's exception


def test_async_methods_work(client, uid):
    counter = client.create_actor(Counter, 3, name=f"counter-{uid}")
    assert counter.async_value() == 3


def test_actor_futures_can_be_waited_together(client, uid):
    a = client.create_actor(Counter, name=f"a-{uid}")
    b = client.create_actor(Counter, 100, name=f"b-{uid}")
    futures = [a.add.remote(1), b.add.remote(1)]
    done, not_done = concurrent.futures.wait(futures, timeout=60)
    assert not not_done
    assert sorted(f.result() for f in done) == [1, 101]


def test_constructor_failure_makes_every_call_raise_actor_died(client, uid):
    broken = client.create_actor(BrokenAtBirth, name=f"broken-{uid}")
    with pytest.raises(ActorDiedError) as info:
        broken.ping()
    assert "missing config" in str(info.value) or "missing config" in str(info.value.__cause__)
    with pytest.raises(ActorDiedError):
        broken.ping.remote().result(timeout=60)


def test_actor_sees_its_job_and_client(client, uid):
    counter = client.create_actor(Counter, name=f"who-{uid}")
    name, client_type = counter.whoami()
    assert name == f"who-{uid}"
    assert client_type == type(client).__name__


def test_handles_passed_to_jobs_work_there(client, uid):
    counter = client.create_actor(Counter, name=f"shared-{uid}")
    jobs = [
        client.submit(
            JobRequest(name=f"bump-{i}-{uid}", entrypoint=Entrypoint.from_callable(bump_counter, args=(counter, 5)))
        )
        for i in range(3)
    ]
    for job in jobs:
        assert job.wait(timeout=120) == JobStatus.SUCCEEDED
    assert counter.add(0) == 15


def test_duplicate_live_actor_name_is_rejected(client, uid):
    client.create_actor(Counter, name=f"unique-{uid}").add(0)
    with pytest.raises(JobAlreadyExists):
        client.create_actor(Counter, name=f"unique-{uid}").add(0)


def test_unpicklable_constructor_argument_is_rejected(client, uid):
    with pytest.raises(SerializationError):
        client.create_actor(Counter, threading.Lock(), name=f"bad-{uid}")


def test_actor_group_members_become_ready_with_their_own_state(client, uid):
    group = client.create_actor_group(Counter, 7, name=f"group-{uid}", count=3)
    handles = group.wait_ready(timeout=120)
    assert len(handles) == 3
    assert group.ready_count == 3
    handles[0].add(1)
    assert [h.add(0) for h in handles] == [8, 7, 7]
    assert all(f"group-{uid}-{i}" in job.job_id for i, job in enumerate(group.jobs))
    assert group.statuses() == [JobStatus.RUNNING] * 3


def test_wait_ready_snapshot_does_not_change(client, uid):
    group = client.create_actor_group(Counter, name=f"snap-{uid}", count=2)
    first = group.wait_ready(count=1, timeout=120)
    assert len(first) >= 1
    snapshot = list(first)
    group.wait_ready(timeout=120)
    assert first == snapshot


def test_actor_group_shutdown_stops_members(client, uid):
    group = client.create_actor_group(Counter, name=f"stop-{uid}", count=2)
    handles = group.wait_ready(timeout=120)
    group.shutdown()
    assert group.statuses() == [JobStatus.STOPPED] * 2  # terminal once shutdown() returns
    for job in group.jobs:
        job.wait(timeout=60, raise_on_failure=False)
    # marin's contract: a call to a shut-down actor raises ActorUnavailableError; Fray's ActorDiedError is one.
    with pytest.raises(ActorUnavailableError) as info:
        handles[0].add(1)
    assert isinstance(info.value, ActorDiedError)
    with pytest.raises(ActorUnavailableError):
        handles[1].add.remote(1).result(timeout=60)


def test_group_with_dead_members_reports_them(client, uid):
    group = client.create_actor_group(BrokenAtBirth, name=f"dead-{uid}", count=2)
    with pytest.raises(ActorDiedError):
        group.wait_ready(timeout=120)
    for job in group.jobs:
        job.wait(timeout=60, raise_on_failure=False)
    assert group.statuses() == [JobStatus.FAILED] * 2


def test_wait_ready_rejects_impossible_counts(client, uid):
    group = client.create_actor_group(Counter, name=f"cnt-{uid}", count=1)
    with pytest.raises(ValueError):
        group.wait_ready(count=2)


def test_host_actor_serves_until_its_shutdown(client, uid):
    # marin's Client.host_actor: an actor the caller hosts and stops; the same on every backend.
    hosted = client.host_actor(Counter, 5, name=f"hosted-{uid}")
    assert hosted.handle.add(2) == 7
    assert hosted.handle.add.remote(1).result(timeout=60) == 8
    hosted.shutdown()
    with pytest.raises(ActorDiedError):
        hosted.handle.add(1)
    hosted.shutdown()  # a second shutdown does nothing
