"""What runs in the task process of an actor's job on the Fray cluster: build the actor and serve it.

:func:`host_actor` is the job's entrypoint. It gives the process its actor identity
(``current_actor()``), builds the instance (a constructor that raises fails the job, and
it is not retried: actor jobs have no failure budget), serves it with an
:class:`~fray.cluster.rpc.ActorServer` (``max_concurrency`` calls at once) and registers the
endpoint with the controller. Then it waits for one of three endings:

* the actor ends itself (``exit()`` / ``fail(exc)``): once the call that asked has been
  answered, the server stops and the job ends SUCCEEDED, or FAILED with ``exc``;
* the job is terminated: the worker's SIGTERM sets ``shutdown_requested``, the server
  stops at once (callers' calls fail), running methods get up to ``SHUTDOWN_GRACE``
  seconds, then the process exits (the worker's SIGKILL follows later regardless);
* the process dies (a crash, the OOM killer, ``fray.testing.kill_actor``): it has told
  the worker beforehand (:func:`fray.process._jobmain.if_killed`) to report such a death as
  a lost process, so the controller retries the job under its preemption budget, which
  is ``ActorConfig.max_restarts``: a restart is a retry of the actor's job, and the new
  attempt runs the constructor again and registers a new endpoint.

A second object on the same server, :data:`CONTROL_SUFFIX`, lets
:func:`fray.testing.kill_actor` make the process die on purpose.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from fray.actor_context import SHUTDOWN_GRACE, ActorCalls, ActorContext, set_process_actor
from fray.cluster.protocol.controller_client import connect_controller
from fray.cluster.protocol.records import TaskKey
from fray.cluster.rpc.server import ActorServer
from fray.core._lifecycle import Failure
from fray.core._remote import copy_died
from fray.errors import ActorDiedError
from fray.job import current_job
from fray.process import _jobmain

__all__ = ["CONTROL_SUFFIX", "control_url", "host_actor"]

#: The control object of an actor is served beside it under ``{name}{CONTROL_SUFFIX}``.
CONTROL_SUFFIX = "--fray-control"


def control_url(actor_url: str, name: str) -> str:
    """The URL of the control object served beside the actor at ``actor_url``."""
    return actor_url.removesuffix(name) + name + CONTROL_SUFFIX


class _Host(ActorCalls):
    """The actor's calls as the RPC server sees them (its call hooks), and the job's termination."""

    terminating = False

    def started(self) -> None:
        self.enter()

    def withheld(self) -> ActorDiedError | None:
        """Once the job is being terminated, every call still running is answered: the actor died."""
        death = self.death if self.terminating else None
        return None if death is None else copy_died(death)

    def ended(self) -> None:
        self.leave()
        self.check_end()

    def terminate(self, *_: Any) -> None:
        """SIGTERM: the job is being terminated."""
        self.terminating = True
        self.context.shutdown_requested.set()
        self.refuse(ActorDiedError(f"actor {self.context.name!r} was terminated"))


class _Control:
    """Served beside the actor: what ``fray.testing`` needs of its process."""

    def crash(self) -> None:
        """Die now, as a crash would: SIGKILL, no cleanup, no answer."""
        os.kill(os.getpid(), signal.SIGKILL)

    def pid(self) -> int:
        return os.getpid()


def host_actor(
    actor_class: type, args: tuple[Any, ...], kwargs: dict[str, Any], name: str, options: dict[str, Any] | None = None
) -> None:
    """The entrypoint of an actor's job (see the module docstring).

    ``options``: ``group`` and ``index`` (a group member), ``max_concurrency``, and
    ``handle``: called with ``job_id=`` it makes the handle ``current_actor().handle`` returns.
    """
    opts = options or {}
    info = current_job()
    assert info is not None, "actor jobs run inside a Fray cluster task"
    address = os.environ["FRAY_CLIENT_SPEC"].removeprefix("fray://")
    make_handle = opts["handle"]
    context = ActorContext.of_actor(
        name, opts.get("group"), int(opts.get("index", 0)), lambda: make_handle(job_id=info.job_id)
    )
    set_process_actor(context)
    host = _Host(context)
    signal.signal(signal.SIGTERM, host.terminate)
    instance = actor_class(*args, **kwargs)  # raising here fails the job: callers see ActorDiedError
    # From here on, a death this process does not explain is a lost process: a restart, if allowed.
    # The worker adds how it died (a signal by name, an exit code) and its last output lines.
    _jobmain.if_killed(Failure.lost(f"the process of actor {name!r} died"))
    host.check_end()
    bind = os.environ.get("FRAY_ADVERTISE_HOST", "127.0.0.1")
    server = ActorServer(host=os.environ.get("FRAY_BIND_HOST", bind), port=0, namespace=info.namespace)
    server.register(name, instance, max_concurrency=int(opts.get("max_concurrency", 1)), hooks=host)
    server.register(name + CONTROL_SUFFIX, _Control())
    server.start()
    key = TaskKey(info.job_id, int(os.environ.get("FRAY_TASK_INDEX", "0")), info.attempt)
    if not host.done.is_set():
        # The task's own job credential (FRAY_CREDENTIAL); the server uses its namespace's key (FRAY_TOKEN).
        connect_controller(address).register_endpoint(info.namespace, name, server.url(name), key)
    host.done.wait()  # until the actor ends itself or the job is terminated (SIGTERM)
    server.stop()  # callers' calls in flight fail now; the call that asked to end was answered already
    if host.terminating:
        host.wait_idle(SHUTDOWN_GRACE)  # a method that watches shutdown_requested may finish cleanly
        os._exit(0)
    end = context.end_request()
    assert end is not None
    if end.error is not None:
        raise end.error  # the job FAILS with it (no retry: actor jobs have no failure budget)
