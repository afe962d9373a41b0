"""Live stacks (issue 35): ``stacks()`` of jobs, actors and actor groups, on every backend.

Each test blocks user code in a function with a telling name (``stuck_here``, ``deep_sleep``,
``inner_wait``) and waits, with a deadline, until ``stacks()`` shows that function. The blocked
code ends itself when the test releases it (an event of the actor, or a stop file all
processes of this machine see), and in any case after a deadline of its own.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import fray
from fray import ActorConfig, Entrypoint, JobRequest, ProcessStacks
from fray.context import get_job_context
from support import wait_until

# How long blocked code waits at most for the test to release it.
_SELF_DEADLINE = 120.0


def _blocked_until(stop: Path | threading.Event, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if isinstance(stop, threading.Event):
            if stop.wait(0.05):
                return
        elif stop.exists():
            return
        else:
            time.sleep(0.05)


def stuck_here(event: threading.Event, marker: str) -> str:
    local_marker = marker  # what stacks(locals=True) must show
    _blocked_until(event, _SELF_DEADLINE)
    return local_marker


class Stuck:
    """An actor whose ``block`` waits in ``stuck_here`` until ``release`` (so it needs max_concurrency >= 2)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.started = threading.Event()

    def block(self, marker: str = "") -> str:
        self.started.set()
        return stuck_here(self.event, marker)

    def is_blocked(self) -> bool:
        return self.started.is_set() and not self.event.is_set()

    def release(self) -> None:
        self.event.set()

    def ping(self) -> str:
        return "pong"


def deep_sleep(stop: str) -> None:
    _blocked_until(Path(stop), _SELF_DEADLINE)


def inner_wait(stop: str) -> str:
    _blocked_until(Path(stop), _SELF_DEADLINE)
    return "done"


def spawn_inner_wait(stop: str) -> None:
    context = get_job_context()
    context.get(context.create_task(inner_wait, stop))


def showing(stacks: tuple[ProcessStacks, ...], function: str) -> list[ProcessStacks]:
    """The processes of ``stacks`` with a thread inside ``function``."""
    return [
        process
        for process in stacks
        if any(frame.function == function for thread in process.threads for frame in thread.frames)
    ]


def _describe(stacks: tuple[ProcessStacks, ...]) -> str:
    return fray.stacks.format_stacks(stacks)


def test_a_blocked_actor_method_shows_in_its_stacks_and_the_actor_serves_on(client, uid):
    actor = client.create_actor(Stuck, name=f"stuck-{uid}", actor_config=ActorConfig(max_concurrency=2))
    assert actor.ping() == "pong"
    call = actor.block.remote("m")
    wait_until(actor.is_blocked, timeout=60, what="the call to start")
    start = time.monotonic()
    seen: list[tuple[ProcessStacks, ...]] = []

    def shows() -> bool:
        stacks = actor.stacks(timeout=5)
        seen.append(stacks)
        return bool(showing(stacks, "stuck_here"))

    if not wait_until_or_false(shows, 5.0):
        raise AssertionError(f"no stuck_here in the actor's stacks within 5 s:\n{_describe(seen[-1])}")
    assert time.monotonic() - start < 5.0 + 5.0  # one last ask may take its own timeout
    process = showing(seen[-1], "stuck_here")[0]
    assert process.error is None
    assert "stuck_here" in process.format()
    assert not call.done()
    actor.release()
    assert call.result(timeout=60) == "m"
    assert actor.ping() == "pong"


def test_asked_for_variables_a_frame_shows_their_repr(client, uid):
    actor = client.create_actor(Stuck, name=f"locals-{uid}", actor_config=ActorConfig(max_concurrency=2))
    marker = f"marker-{uid}"
    call = actor.block.remote(marker)
    wait_until(actor.is_blocked, timeout=60, what="the call to start")

    def frame() -> fray.FrameInfo | None:
        for process in actor.stacks(timeout=5, locals=True):
            for thread in process.threads:
                for candidate in thread.frames:
                    if candidate.function == "stuck_here":
                        return candidate
        return None

    found = wait_until(frame, timeout=30, what="stuck_here in the actor's stacks")
    assert found.locals is not None
    assert ("local_marker", repr(marker)) in found.locals
    actor.release()
    assert call.result(timeout=60) == marker


def test_each_replica_of_a_job_shows_its_stack(client, uid, tmp_path):
    stop = tmp_path / "stop"
    job = client.submit(
        JobRequest(name=f"deep-{uid}", entrypoint=Entrypoint.from_callable(deep_sleep, args=(str(stop),)), replicas=2)
    )
    try:

        def both() -> tuple[ProcessStacks, ...] | None:
            sleeping = showing(job.stacks(timeout=5), "deep_sleep")
            labels = {process.label for process in sleeping}
            return tuple(sleeping) if {"replica 0", "replica 1"} <= labels else None

        sleeping = wait_until(both, timeout=90, what="deep_sleep in both replicas' stacks")
        assert all(process.error is None and process.host for process in sleeping)
    finally:
        stop.touch()
        job.terminate()


def test_a_job_context_task_shows_with_its_task_id(client, uid, tmp_path):
    stop = tmp_path / "stop"
    job = client.submit(
        JobRequest(name=f"tasks-{uid}", entrypoint=Entrypoint.from_callable(spawn_inner_wait, args=(str(stop),)))
    )
    try:

        def task() -> list[ProcessStacks]:
            return [process for process in showing(job.stacks(timeout=5), "inner_wait") if process.task_id]

        found = wait_until(task, timeout=120, what="inner_wait in a task's stacks")
        assert found[0].task_id and found[0].task_id in found[0].format()
    finally:
        stop.touch()
        job.terminate()


def test_a_dead_actor_is_reported_with_an_error_not_a_hang(client, uid):
    group = client.create_actor_group(Stuck, name=f"dead-{uid}", count=2)
    handles = group.wait_ready(timeout=120)
    assert [handle.ping() for handle in handles] == ["pong", "pong"]
    live = group.stacks(timeout=5)
    assert len(live) == 2 and all(process.error is None for process in live), _describe(live)
    group.shutdown()
    start = time.monotonic()
    stacks = group.stacks(timeout=3)
    assert time.monotonic() - start < 30
    assert len(stacks) == 2
    assert all(process.error and not process.threads for process in stacks), _describe(stacks)


def wait_until_or_false(predicate, timeout: float) -> bool:
    """True as soon as ``predicate()`` is, False once ``timeout`` passed (the last try still counts)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def test_stacks_cross_processes_as_json_only():
    here = ProcessStacks("replica 0", "h", os.getpid(), error="did not answer within 1 s (pid 1 on host h)")
    assert ProcessStacks.from_json(here.to_json()) == here
    assert "did not answer" in fray.stacks.format_stacks([here])
