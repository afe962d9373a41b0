"""The backend contract: every backend's client has the Client protocol's methods, with its signatures.

mypy checks the same statically (``fray/core/_contract.py``); this checks the classes the
suite really runs, and the keyword everyone relies on: ``submit(request, detached=...)``.
"""

from __future__ import annotations

import inspect
import sys

import pytest

from fray import ConfigError, Entrypoint, JobFailed, JobRequest, JobStatus
from fray.actor import ActorHandleBase
from fray.client import Client
from fray.context import JobContextBase
from fray.job import JobHandleBase
from fray.queue import QueueClient

_PROTOCOL_METHODS = sorted(
    name
    for name, value in vars(Client).items()
    if callable(value) and (not name.startswith("_") or name in ("__enter__", "__exit__"))
)


def _shape(function: object) -> list[tuple[str, object, object]]:
    """A signature without annotations: each parameter's name, kind and default."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]  # type: ignore[arg-type]


def test_the_protocol_names_the_methods_users_call() -> None:
    # A guard for the test below: it compares these, so an empty list would pass anything.
    assert {"submit", "create_actor", "create_actor_group", "create_queue", "shutdown", "__enter__", "__exit__"} <= set(
        _PROTOCOL_METHODS
    )


@pytest.mark.parametrize("method", _PROTOCOL_METHODS)
def test_every_client_method_has_the_protocols_signature(client, method: str) -> None:
    implementation = getattr(type(client), method, None)
    assert implementation is not None, f"{type(client).__name__} has no {method}()"
    assert _shape(implementation) == _shape(getattr(Client, method)), (
        f"{type(client).__name__}.{method}{inspect.signature(implementation)} differs from "
        f"Client.{method}{inspect.signature(getattr(Client, method))}"
    )


@pytest.mark.parametrize("detached", [True, False])
def test_submit_takes_detached(client, uid, detached: bool) -> None:
    request = JobRequest(name=f"detached-{uid}", entrypoint=Entrypoint.from_callable(print, args=("ran",)))
    job = client.submit(request, detached=detached)
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED


def exit_with(code: int | None) -> None:
    print("about to exit")
    sys.exit(code)


@pytest.mark.parametrize("code", [0, None])
def test_sys_exit_zero_in_a_callable_job_is_success(client, uid, code: int | None) -> None:
    request = JobRequest(name=f"exit0-{uid}", entrypoint=Entrypoint.from_callable(exit_with, args=(code,)))
    assert client.submit(request).wait(timeout=120) == JobStatus.SUCCEEDED


def test_sys_exit_nonzero_in_a_callable_job_fails_with_its_code(client, uid) -> None:
    request = JobRequest(name=f"exit3-{uid}", entrypoint=Entrypoint.from_callable(exit_with, args=(3,)))
    with pytest.raises(JobFailed) as info:
        client.submit(request).wait(timeout=120)
    assert info.value.exit_code == 3, info.value


class _Echo:
    def echo(self, value: object) -> object:
        return value


def test_every_role_is_a_subclass_of_its_declared_base(client, uid) -> None:
    # What each backend hands out is a subclass of the base that declares the role (fray/core/_contract.py),
    # so a hook a backend forgot fails at instantiation, not as an AttributeError mid-run.
    job = client.submit(JobRequest(name=f"bases-{uid}", entrypoint=Entrypoint.from_callable(print, args=("ran",))))
    assert isinstance(job, JobHandleBase), type(job).__mro__
    actor = client.create_actor(_Echo, name=f"bases-actor-{uid}")
    assert isinstance(actor, ActorHandleBase), type(actor).__mro__
    assert actor.echo(7) == 7 and actor.echo.remote(8).result(timeout=120) == 8
    group = client.create_actor_group(_Echo, name=f"bases-group-{uid}", count=1)
    assert all(isinstance(member, ActorHandleBase) for member in group.wait_ready(timeout=120))
    assert isinstance(client._fray_job_context(), JobContextBase)
    try:
        queue = client.create_queue(f"bases-queue-{uid}")
    except ConfigError as exc:  # a backend without queues says so by name (Iris: fray.queue.actor_queue)
        assert "queue" in str(exc)
    else:
        assert isinstance(queue, QueueClient), type(queue).__mro__
        queue.push(1)
        assert queue.counts().pending == queue.pending() == 1
    assert job.wait(timeout=120) == JobStatus.SUCCEEDED
    group.shutdown()
