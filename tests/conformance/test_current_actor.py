"""fray.current_actor() on every backend: identity, a handle to itself, shutdown notice, ending itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from fray import (
    ActorContextError,
    ActorDiedError,
    Entrypoint,
    JobFailed,
    JobRequest,
    JobStatus,
    current_actor,
)
from support import wait_until


class SelfAware:
    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        self.seen_in_init = _identity()

    def identity(self) -> tuple[str, str | None, int]:
        return _identity()

    def identity_in_init(self) -> tuple[str, str | None, int]:
        return self.seen_in_init

    async def identity_async(self) -> tuple[str, str | None, int]:
        return _identity()

    def me(self):
        return current_actor().handle

    def echo(self, value: str) -> str:
        return f"{self.tag}{value}"

    def leave(self) -> str:
        current_actor().exit()
        return "bye"

    def leave_twice(self) -> str:
        current_actor().exit()
        try:
            current_actor().exit()
        except ActorContextError as exc:
            return f"refused: {exc}"
        return "accepted twice"

    def give_up(self, message: str) -> str:
        current_actor().fail(LookupError(message))
        return "failing"

    def wait_for_shutdown(self, marker: str, result: str) -> str:
        Path(marker).write_text("started")
        context = current_actor()
        while not context.shutdown_requested.wait(0.05):
            pass
        written = Path(result + ".tmp")
        written.write_text("finished cleanly")
        written.replace(result)  # whole or not at all: the test reads it as soon as it exists
        return "stopped"


def _identity() -> tuple[str, str | None, int]:
    context = current_actor()
    return context.name, context.group_name, context.index


def call_back(handle, value: str) -> None:
    """A job that calls the actor whose handle it was given."""
    assert handle.echo(value) == f"tag:{value}"


def ask_for_actor() -> None:
    """A job is not an actor: current_actor() must say so."""
    try:
        current_actor()
    except ActorContextError as exc:
        assert "not an actor" in str(exc)
        return
    raise AssertionError("current_actor() worked in a plain job")


def test_current_actor_outside_an_actor_is_a_clear_error():
    with pytest.raises(ActorContextError, match="only inside an actor") as info:
        current_actor()
    assert isinstance(info.value, RuntimeError)


def test_current_actor_in_a_plain_job_is_a_clear_error(client, uid):
    job = client.submit(JobRequest(name=f"plain-{uid}", entrypoint=Entrypoint.from_callable(ask_for_actor)))
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED


def test_single_actor_knows_its_name(client, uid):
    actor = client.create_actor(SelfAware, name=f"single-{uid}")
    assert actor.identity() == (f"single-{uid}", None, 0)
    assert actor.identity_in_init() == (f"single-{uid}", None, 0)
    assert actor.identity_async() == (f"single-{uid}", None, 0)


def test_group_members_know_their_group_and_index(client, uid):
    group = client.create_actor_group(SelfAware, name=f"grp-{uid}", count=3)
    handles = group.wait_ready(timeout=120)
    assert [h.identity() for h in handles] == [(f"grp-{uid}-{i}", f"grp-{uid}", i) for i in range(3)]


def test_handle_to_itself_works_for_the_caller_and_for_jobs(client, uid):
    actor = client.create_actor(SelfAware, "tag:", name=f"selfie-{uid}")
    me = actor.me()
    assert me.echo("x") == "tag:x"
    job = client.submit(
        JobRequest(name=f"caller-{uid}", entrypoint=Entrypoint.from_callable(call_back, args=(me, "y")))
    )
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED


def test_exit_ends_the_job_as_succeeded_after_the_call_returns(client, uid):
    group = client.create_actor_group(SelfAware, name=f"exit-{uid}", count=1)
    actor = group.wait_ready(timeout=120)[0]
    assert actor.leave() == "bye"
    assert group.jobs[0].wait(timeout=120) == JobStatus.SUCCEEDED
    with pytest.raises(ActorDiedError):
        actor.echo.remote("late").result(timeout=60)


def test_exit_twice_is_refused(client, uid):
    group = client.create_actor_group(SelfAware, name=f"twice-{uid}", count=1)
    actor = group.wait_ready(timeout=120)[0]
    answer = actor.leave_twice()
    assert answer.startswith("refused:") and "already" in answer
    assert group.jobs[0].wait(timeout=120) == JobStatus.SUCCEEDED


def test_fail_ends_the_job_as_failed_with_the_exception(client, uid):
    group = client.create_actor_group(SelfAware, name=f"fail-{uid}", count=1)
    actor = group.wait_ready(timeout=120)[0]
    assert actor.give_up("no more work") == "failing"
    with pytest.raises(JobFailed, match="no more work") as info:
        group.jobs[0].wait(timeout=120)
    assert isinstance(info.value, LookupError)
    with pytest.raises(ActorDiedError) as died:
        actor.echo.remote("late").result(timeout=60)
    assert isinstance(died.value.__cause__, LookupError)


def test_shutdown_is_announced_to_a_running_method(client, uid, tmp_path):
    group = client.create_actor_group(SelfAware, name=f"announce-{uid}", count=1)
    actor = group.wait_ready(timeout=120)[0]
    marker, result = tmp_path / "started", tmp_path / "result"
    running = actor.wait_for_shutdown.remote(str(marker), str(result))
    wait_until(marker.exists, timeout=120, what="the method to start")
    group.shutdown()
    wait_until(result.exists, timeout=120, what="the method to see shutdown_requested")
    assert result.read_text() == "finished cleanly"
    with pytest.raises(ActorDiedError):
        running.result(timeout=120)
    assert group.jobs[0].wait(timeout=120, raise_on_failure=False) == JobStatus.STOPPED
