"""ActorConfig on every backend: validation, concurrency, restarts, retries, lifetime."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from fray import ActorConfig, ActorDiedError, ActorUnavailableError, ConfigError, JobStatus, ResourceConfig
from fray.actor_config import check_actor_config_supported
from fray.testing import kill_actor
from support import wait_until

# ----- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"max_concurrency": 0}, "max_concurrency=0"),
        ({"max_concurrency": 2.5}, "whole number"),
        ({"max_concurrency": True}, "whole number"),
        ({"max_restarts": -1}, "max_restarts=-1"),
        ({"max_task_retries": -2}, "max_task_retries=-2"),
        ({"max_restarts": 0, "max_task_retries": 1}, "set max_restarts"),
        ({"lifetime": "forever"}, "lifetime='forever'"),
    ],
)
def test_bad_actor_config_says_what_to_do(settings, words):
    with pytest.raises(ConfigError, match=words):
        ActorConfig(**settings)


def test_call_retries_without_restarts_allow_as_many_restarts():
    # marin's ActorConfig(max_task_retries=N) leaves max_restarts unset: retried calls need an actor to reach.
    assert ActorConfig(max_task_retries=2).max_restarts == 2
    assert ActorConfig().max_restarts == 0


def test_actor_config_must_be_an_actor_config(client, uid):
    with pytest.raises(ConfigError, match=r"fray\.ActorConfig"):
        client.create_actor(Worker, name=f"bad-{uid}", actor_config={"max_concurrency": 2})


def test_unsupported_fields_are_refused_by_name():
    config = ActorConfig(max_concurrency=4, max_restarts=2)
    with pytest.raises(ConfigError, match=r"the toy backend cannot honour ActorConfig\(max_restarts=2\)"):
        check_actor_config_supported("toy", config, {"max_concurrency"})
    check_actor_config_supported("toy", ActorConfig(max_concurrency=4), {"max_concurrency"})


# ----- concurrency -----------------------------------------------------------------------------


class Worker:
    """Calls meet at barriers, so a test learns how many ran at once without timing anything."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.barriers: dict[int, threading.Barrier] = {}
        self.gates: dict[int, asyncio.Event] = {}
        self.arrived: dict[int, int] = {}

    def meet(self, parties: int) -> int:
        """Return once ``parties`` calls are inside at the same time (BrokenBarrierError after 60 s)."""
        with self.lock:
            barrier = self.barriers.setdefault(parties, threading.Barrier(parties))
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            return barrier.wait(timeout=60)
        finally:
            with self.lock:
                self.in_flight -= 1

    async def meet_async(self, parties: int) -> int:
        """The same with coroutines on the actor's event loop."""
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        gate = self.gates.setdefault(parties, asyncio.Event())
        self.arrived[parties] = self.arrived.get(parties, 0) + 1
        if self.arrived[parties] == parties:
            gate.set()
        try:
            await asyncio.wait_for(gate.wait(), timeout=60)
            return self.arrived[parties]
        finally:
            self.in_flight -= 1

    def peak_in_flight(self) -> int:
        return self.peak

    def pid(self) -> int:
        return os.getpid()


def test_max_concurrency_runs_sync_calls_at_once(client, uid):
    actor = client.create_actor(Worker, name=f"conc-{uid}", actor_config=ActorConfig(max_concurrency=4))
    futures = [actor.meet.remote(4) for _ in range(4)]
    assert sorted(f.result(timeout=120) for f in futures) == [0, 1, 2, 3]


def test_max_concurrency_bounds_the_calls_in_flight(client, uid):
    actor = client.create_actor(Worker, name=f"bound-{uid}", actor_config=ActorConfig(max_concurrency=2))
    futures = [actor.meet.remote(2) for _ in range(6)]
    for future in futures:
        future.result(timeout=120)
    assert actor.peak_in_flight() == 2


def test_max_concurrency_runs_async_calls_at_once(client, uid):
    actor = client.create_actor(Worker, name=f"aconc-{uid}", actor_config=ActorConfig(max_concurrency=3))
    futures = [actor.meet_async.remote(3) for _ in range(3)]
    assert [f.result(timeout=120) for f in futures] == [3, 3, 3]
    assert actor.peak_in_flight() == 3


def test_default_actor_runs_async_calls_one_at_a_time(client, uid):
    actor = client.create_actor(Worker, name=f"aone-{uid}")
    futures = [actor.meet_async.remote(1) for _ in range(5)]
    assert [f.result(timeout=120) for f in futures] == [1, 2, 3, 4, 5]
    assert actor.peak_in_flight() == 1


# ----- restarts --------------------------------------------------------------------------------


class Phoenix:
    """Knows which instance it is; its ``block`` runs until its process dies."""

    def __init__(self) -> None:
        self.born = uuid.uuid4().hex

    def incarnation(self) -> str:
        return self.born

    def block(self, marker: str) -> str:
        _write_at_once(Path(marker), self.born)
        while True:  # ends only with the process (short sleeps: the local backend's stand-in stops between them)
            time.sleep(0.02)

    def block_once(self, marker: str) -> str:
        """Blocks the first time; run again (on a restarted actor) it returns at once."""
        path = Path(marker)
        if path.exists():
            return f"retried after {path.read_text()}"
        _write_at_once(path, self.born)
        while True:
            time.sleep(0.02)


def _write_at_once(path: Path, text: str) -> None:
    # The test waits for the file to exist: it must never see it empty, half written (a rename is atomic).
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def _next_incarnation(actor, before: str) -> str:
    """The instance that answers once the actor has restarted.

    A call made while it restarts may fail: ActorDiedError (it went to the dead instance) or
    ActorUnavailableError (Ray refuses calls to an actor that is restarting).
    """

    def answer() -> str | None:
        try:
            born = actor.incarnation.remote().result(timeout=120)
        except (ActorDiedError, ActorUnavailableError):
            return None
        return born if born != before else None

    return wait_until(answer, timeout=120, what="the restarted actor to answer")


def test_killed_actor_restarts_and_in_flight_calls_fail(client, uid, tmp_path):
    group = client.create_actor_group(Phoenix, name=f"phoenix-{uid}", count=1, actor_config=ActorConfig(max_restarts=1))
    actor = group.wait_ready(timeout=120)[0]
    first = actor.incarnation()
    marker = tmp_path / "running"
    in_flight = actor.block.remote(str(marker))
    wait_until(marker.exists, timeout=120, what="the call to start")
    kill_actor(actor)
    with pytest.raises(ActorDiedError):
        in_flight.result(timeout=120)
    second = _next_incarnation(actor, first)
    assert actor.incarnation() == second  # later calls reach the new instance
    assert group.statuses() == [JobStatus.RUNNING]
    # The one restart is used up: the next death is final, and calls fail at once, never hang.
    kill_actor(actor)
    wait_until(lambda: group.statuses() == [JobStatus.FAILED], timeout=120, what="the actor's job to fail")
    with pytest.raises(ActorDiedError):
        actor.incarnation.remote().result(timeout=60)


def test_killed_actor_without_restarts_stays_dead(client, uid, tmp_path):
    group = client.create_actor_group(Phoenix, name=f"mortal-{uid}", count=1)
    actor = group.wait_ready(timeout=120)[0]
    marker = tmp_path / "running"
    in_flight = actor.block.remote(str(marker))
    wait_until(marker.exists, timeout=120, what="the call to start")
    kill_actor(actor)
    with pytest.raises(ActorDiedError):
        in_flight.result(timeout=120)
    assert group.jobs[0].wait(timeout=120, raise_on_failure=False) == JobStatus.FAILED
    with pytest.raises(ActorDiedError):
        actor.incarnation.remote().result(timeout=60)


def test_call_in_flight_is_retried_on_the_restarted_actor(client, uid, tmp_path):
    actor = client.create_actor(
        Phoenix, name=f"retry-{uid}", actor_config=ActorConfig(max_restarts=1, max_task_retries=1)
    )
    first = actor.incarnation()
    marker = tmp_path / "running"
    in_flight = actor.block_once.remote(str(marker))
    wait_until(marker.exists, timeout=120, what="the call to start")
    kill_actor(actor)
    assert in_flight.result(timeout=120) == f"retried after {first}"
    assert actor.incarnation() != first


# ----- lifetime and resources ------------------------------------------------------------------


def test_detached_actor_outlives_its_client(client, uid):
    group = client.create_actor_group(
        Worker, name=f"detached-{uid}", count=1, actor_config=ActorConfig(lifetime="detached")
    )
    actor = group.wait_ready(timeout=120)[0]
    pid = actor.pid()
    client.shutdown(wait=False)
    try:
        assert actor.pid() == pid
    finally:  # nothing else will stop it
        group.jobs[0].terminate()


def test_owned_actor_ends_with_its_client(client, uid):
    actor = client.create_actor(Worker, name=f"owned-{uid}")
    actor.pid()
    client.shutdown(wait=False)
    with pytest.raises(ActorDiedError):
        actor.pid.remote().result(timeout=120)


def test_placement_only_resources_reserve_nothing():
    resources = ResourceConfig.placement_only(preemptible=False)
    assert resources.reserves_nothing
    assert not resources.preemptible
    assert not ResourceConfig().reserves_nothing
