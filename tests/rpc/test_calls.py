"""Calling actors in another process: results, errors, futures, ordering and concurrency."""

from __future__ import annotations

import concurrent.futures
import pickle

import numpy as np
import pytest

from fray.actor import ActorFuture, ActorHandle
from fray.cluster.rpc import ActorClient, FixedResolver, RpcOptions, RpcTimeoutError, list_actors, list_methods
from fray.errors import ActorUnavailableError, RemoteError, RemoteTraceback, SerializationError
from rpc.actors import Counter


def client_for(server, name: str, **kwargs) -> ActorClient:
    return ActorClient(FixedResolver({name: server.url(name)}), name, **kwargs)


def test_blocking_and_remote_calls_return_values(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    start = counter.incr()
    assert counter.incr(by=2) == start + 2
    future = counter.incr.remote(3)
    assert isinstance(future, ActorFuture)
    assert future.result(timeout=30) == start + 5
    assert counter.aincr(1) == start + 6  # async def methods work


def test_client_is_an_actor_handle(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    assert isinstance(counter, ActorHandle)
    assert counter._fray_ready().result(timeout=30) is None


def test_futures_can_be_waited_on_together(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    futures = [counter.echo.remote(i) for i in range(100)]
    _done, not_done = concurrent.futures.wait(futures, timeout=30)
    assert not not_done
    assert [f.result() for f in futures] == list(range(100))


def test_calls_from_one_client_run_in_order(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    base = len(counter.order())
    futures = [counter.record.remote(i) for i in range(200)]
    for future in futures:
        future.result(timeout=30)
    assert counter.order()[base:] == list(range(200))


def test_a_long_call_does_not_block_other_actors(shared_server) -> None:
    gate = client_for(shared_server, "gate")
    counter = client_for(shared_server, "counter")
    waiting = gate.wait.remote(30.0)
    assert counter.echo(7) == 7  # another actor on the same server answers meanwhile
    gate.open()  # max_concurrency=4: runs while wait() is still running
    assert waiting.result(timeout=30) is True


def test_max_concurrency_lets_calls_overlap(shared_server) -> None:
    rendezvous = client_for(shared_server, "rendezvous")
    first, second = rendezvous.meet.remote(20.0), rendezvous.meet.remote(20.0)
    assert first.result(timeout=30) and second.result(timeout=30)
    first, second = rendezvous.ameet.remote(20.0), rendezvous.ameet.remote(20.0)
    assert first.result(timeout=30) and second.result(timeout=30)


def test_remote_exception_keeps_its_type_and_traceback(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    with pytest.raises(KeyError) as info:
        counter.fail("boom")
    assert "boom" in str(info.value)
    assert isinstance(info.value, RemoteError)
    assert "in fail" in info.value.traceback_text
    assert type(info.value.__cause__) is KeyError  # the original exception is the cause
    assert isinstance(info.value.__cause__.__cause__, RemoteTraceback)  # and the traceback is under it
    with pytest.raises(KeyError):
        counter.fail.remote("again").result(timeout=30)


def test_exception_that_cannot_be_rebuilt_becomes_remote_error(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    with pytest.raises(RemoteError) as info:
        counter.fail_unpicklable()
    assert info.value.type_name.endswith("TwoArgError")
    assert "a+b" in info.value.message
    assert "fail_unpicklable" in info.value.traceback_text


def test_unpicklable_argument_is_refused_at_the_call_and_named(shared_server) -> None:
    import threading

    counter = client_for(shared_server, "counter")
    with pytest.raises(SerializationError, match=r"^actor 'counter', method 'echo': argument 0 cannot be pickled"):
        counter.echo(threading.Lock())
    # .remote() refuses at once too (nothing was sent), naming the keyword argument.
    with pytest.raises(SerializationError, match="keyword argument 'value' cannot be pickled"):
        counter.echo.remote(value=threading.Lock())
    assert counter.echo(1) == 1  # the connection is still fine


def test_unpicklable_result_raises_serialization_error(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    expected = r"^actor 'counter', method 'unpicklable_result': the return value cannot be pickled"
    with pytest.raises(SerializationError, match=expected) as info:
        counter.unpicklable_result()
    assert not isinstance(info.value, RemoteError), "Fray's own refusal, not an exception the method raised"
    with pytest.raises(SerializationError, match=expected):
        counter.unpicklable_result.remote().result(timeout=30)
    assert counter.echo(2) == 2


def test_lambdas_travel_by_value(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    offset = 41
    assert counter.apply(lambda x: x + offset, 1) == 42


def test_typed_client_checks_methods_locally(shared_server) -> None:
    counter = ActorClient[Counter](FixedResolver({"counter": shared_server.url("counter")}), "counter")
    with pytest.raises(AttributeError, match="no such method"):
        counter.nope  # noqa: B018
    with pytest.raises(AttributeError):
        counter._private  # noqa: B018
    explicit = client_for(shared_server, "counter", cls=Counter)
    assert explicit.typed().echo(3) == 3


def test_private_and_unknown_methods_are_refused_by_the_server(shared_server) -> None:
    counter = client_for(shared_server, "counter")  # untyped: the server decides
    with pytest.raises(AttributeError, match="no such method"):
        counter.nope()


def test_list_methods_and_actors(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    methods = {m.name: m for m in list_methods(counter)}
    assert "_private" not in methods
    assert methods["incr"].doc == "Add ``by`` and return the new value."
    assert "by: int = 1" in methods["incr"].signature
    assert methods["aincr"].is_async
    names = {info.name for info in list_actors(shared_server.address)}
    assert {"counter", "gate", "rendezvous", "sleeper"} <= names


def test_large_payloads_round_trip(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    array = np.arange(64 * 1024 * 1024 // 8, dtype=np.int64)
    back = counter.echo(array)
    assert back.dtype == array.dtype and np.array_equal(back, array)
    data = bytes(range(256)) * 4096  # 1 MiB of bytes stays bytes
    echoed = counter.echo(data)
    assert type(echoed) is bytes and echoed == data
    mixed = counter.echo({"a": np.ones((512, 512)), "b": bytearray(b"x" * 200_000), "c": [1, "two"]})
    assert np.array_equal(mixed["a"], np.ones((512, 512))) and mixed["b"] == bytearray(b"x" * 200_000)
    fortran = np.asfortranarray(np.arange(20_000.0).reshape(100, 200))
    assert np.array_equal(counter.echo(fortran), fortran)


def test_timeout_raises_and_says_the_call_may_have_run(shared_server) -> None:
    sleeper = client_for(shared_server, "sleeper", options=RpcOptions(timeout=0.3))
    with pytest.raises(RpcTimeoutError, match="may or may not have run"):
        sleeper.wait(3.0)
    with pytest.raises(TimeoutError):
        sleeper.wait.remote(3.0).result(timeout=30)
    assert sleeper.with_options(timeout=None).wait(0.0) is False


def test_handle_pickles_without_token_or_socket(shared_server) -> None:
    counter = client_for(shared_server, "counter", options=RpcOptions(timeout=30.0))
    counter.echo(1)  # connected
    data = pickle.dumps(counter)
    assert b"test-cluster-token" not in data
    clone = pickle.loads(data)
    assert clone.options == RpcOptions(timeout=30.0) and clone.namespace == counter.namespace
    assert clone.echo("x") == "x"


def test_not_registered_actor_fails_fast_or_after_retries(shared_server) -> None:
    missing = client_for(shared_server, "missing", options=RpcOptions(retries=2))
    with pytest.raises(ActorUnavailableError, match=r"not sent.*attempt 3 of 3"):
        missing.echo(1)
    future = ActorClient(FixedResolver({}), "nowhere").echo.remote(1)
    with pytest.raises(ActorUnavailableError, match="no endpoint"):
        future.result(timeout=30)


def test_queued_calls_are_sent_without_anyone_waiting(shared_server) -> None:
    gate = client_for(shared_server, "gate")
    waiting = gate.wait.remote(30.0)
    opening = gate.open.remote()  # queued behind a running call; must still leave promptly
    done, _ = concurrent.futures.wait([waiting, opening], timeout=30)
    assert len(done) == 2 and waiting.result() is True


def test_many_threads_share_one_client(shared_server) -> None:
    counter = client_for(shared_server, "counter")
    before = counter.incr(0)

    def work(seed: int) -> int:
        total = 0
        for i in range(150):
            if i % 3 == 0:
                assert counter.echo((seed, i)) == (seed, i)
            futures = [counter.incr.remote(1) for _ in range(2)]
            total += len([f.result(timeout=30) for f in futures])
        return total

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        added = sum(pool.map(work, range(8)))
    assert counter.incr(0) == before + added == before + 8 * 300


def test_pipelined_large_and_small_calls_do_not_deadlock(shared_server) -> None:
    # Both directions carry more than the socket buffers hold at once: the client must keep
    # reading responses while it is still writing requests.
    counter = client_for(shared_server, "counter")
    big = np.ones(8 * 1024 * 1024, dtype=np.uint8)
    futures = []
    for _ in range(12):
        futures.append(counter.echo.remote(big))
        futures.extend(counter.echo.remote(j) for j in range(40))
    results = [f.result(timeout=60) for f in futures]
    assert sum(1 for r in results if isinstance(r, np.ndarray) and r.nbytes == big.nbytes) == 12
    assert [r for r in results if not isinstance(r, np.ndarray)] == list(range(40)) * 12
