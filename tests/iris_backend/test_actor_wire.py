"""A Fray actor's calls over Iris's actor RPC, without a cluster: Iris's ActorServer in this process.

The host's dispatch (``fray.iris._actor_host``) is served by Iris's own ``ActorServer`` on a
local port, and reached by a bare :class:`IrisActorHandle` through a fixed resolver: what
travels (``fray.iris._wire``), Fray's error forms, ``.submit()``'s long-running operations and
the seams marin's tests use.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterator

import pytest
from iris.actor.resolver import FixedResolver
from iris.actor.server import ActorServer

import fray.iris_backend as iris_backend
from fray import ActorUnavailableError, RemoteError, SerializationError
from fray.actor import public_methods
from fray.actor_context import ActorContext
from fray.iris._actor_host import _Dispatch
from fray.iris.actor import IrisActorHandle
from fray.iris.operation import OperationFuture


class Counter:
    def __init__(self) -> None:
        self.value = 0

    def add(self, amount: int) -> int:
        self.value += amount
        return self.value

    def fail(self, key: str) -> None:
        raise KeyError(key)

    def lock(self) -> threading.Lock:
        return threading.Lock()

    def start_operation(self) -> str:  # a name Iris's ActorClient has a method of its own for
        return "mine"

    def slow(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


@pytest.fixture
def counter() -> Iterator[IrisActorHandle]:
    instance = Counter()
    dispatch = _Dispatch("ctr", instance, ActorContext.of_actor("ctr", None, 0, lambda: None), 4)
    server = ActorServer(host="127.0.0.1", max_concurrency=6)
    server.register("ctr", dispatch.served(public_methods(Counter)))
    port = server.serve_background()
    try:
        yield IrisActorHandle("ctr", resolver=FixedResolver({"ctr": f"http://127.0.0.1:{port}"}))
    finally:
        server.stop()


def test_calls_values_and_errors_keep_frays_rules(counter):
    assert counter.add(2) == 2 and counter.add.remote(3).result(timeout=30) == 5
    with pytest.raises(KeyError, match="lost") as info:
        counter.fail("lost")
    assert isinstance(info.value, RemoteError)
    with pytest.raises(SerializationError, match="lock"):
        counter.lock()
    with pytest.raises(SerializationError):
        counter.add(threading.Lock())
    assert counter.start_operation() == "mine"
    assert counter.add(0) == 5  # the actor survives its method's exception


def test_submit_is_a_long_running_operation(counter):
    future = counter.slow.submit(0.2)
    assert isinstance(future, OperationFuture)
    assert future.result(timeout=30) == 0.2
    with pytest.raises(KeyError, match="gone") as info:
        counter.fail.submit("gone").result(timeout=30)
    assert isinstance(info.value, RemoteError)
    slow = counter.slow.submit(5)
    with pytest.raises(TimeoutError, match="cancelled"):
        slow.result(timeout=0.2)


def test_operation_futures_can_be_waited_together(counter):
    import concurrent.futures

    futures = [counter.add.submit(1), counter.add.submit(1)]
    done, pending = concurrent.futures.wait(futures, timeout=30)
    assert not pending and sorted(f.result() for f in done) == [1, 2]


def test_a_pickled_handle_carries_no_connection(counter):
    counter.add(1)
    copy = pickle.loads(pickle.dumps(counter))
    assert copy._endpoint_name == "ctr" and copy._client is None and copy._resolver is None


def test_actor_client_is_looked_up_on_marins_module(counter, monkeypatch):
    seen = []

    class Stand:
        def add(self, *_args):
            return 41

    def stand_in(resolver, name):
        seen.append(name)
        return Stand()

    monkeypatch.setattr(iris_backend, "ActorClient", stand_in)
    assert counter.add(1) == 41 and seen == ["ctr"]


def test_a_lost_operation_is_actor_unavailable():
    class Forgetful:
        def poll_operation_status(self, operation_id):
            from connectrpc.code import Code
            from connectrpc.errors import ConnectError

            raise ConnectError(Code.NOT_FOUND, "no such operation")

    with pytest.raises(ActorUnavailableError, match="Operation op-1 was lost"):
        OperationFuture(Forgetful(), "op-1").result(timeout=5)
