"""Failures: servers killed mid-call, actors restarted under the same name, retries, readiness."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable

import pytest

from fray.cluster.rpc import (
    ActorClient,
    ActorServer,
    CallNotSentError,
    ClusterResolver,
    FixedResolver,
    RpcOptions,
    serve_registry,
)
from fray.errors import ActorUnavailableError
from rpc.actors import Counter


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``predicate`` until it holds, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.001)  # a poll interval (yields the GIL to the server threads), not a guess


def test_kill_9_mid_call_fails_in_flight_calls_promptly(server_factory) -> None:
    server = server_factory({"gate": ("Gate", 4)})
    gate = ActorClient(FixedResolver({"gate": server.url("gate")}), "gate", options=RpcOptions(retries=5))
    in_flight = gate.block_forever.remote()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        blocking = pool.submit(gate.block_forever)  # a blocking call, reading the socket itself
        wait_until(lambda: gate.running() == 2)
        server.kill()
        for future in (in_flight, blocking):
            # Never a hang, never a silent retry (retries only cover calls that were not sent).
            with pytest.raises(ActorUnavailableError, match="may or may not have run"):
                future.result(timeout=30)
    with pytest.raises(ActorUnavailableError, match="not sent"):
        gate.running()  # nothing listens any more: refused, so provably not sent


def test_only_calls_that_never_left_are_typed_as_safe_to_resend(server_factory) -> None:
    # Callers that must not run a call twice (job submission) resend only on CallNotSentError.
    server = server_factory({"gate": ("Gate", 4)})
    gate = ActorClient(FixedResolver({"gate": server.url("gate")}), "gate")
    in_flight = gate.block_forever.remote()
    wait_until(lambda: gate.running() == 1)
    server.kill()
    sent = in_flight.exception(timeout=30)
    assert isinstance(sent, ActorUnavailableError) and not isinstance(sent, CallNotSentError)
    with pytest.raises(CallNotSentError):
        gate.running()


def test_restart_under_same_name_is_detected_then_followed(server_factory) -> None:
    registry = server_factory({"__registry__": ("", 0)})
    first = server_factory({"counter": ("Counter", 1)}, registry=registry.address)
    counter = ActorClient(ClusterResolver(registry.address), "counter")
    assert counter.incr() == 1
    first_pid = counter.pid()
    first.kill()
    second = server_factory({"counter": ("Counter", 1)}, registry=registry.address)
    # The client re-resolves, finds a different actor id behind the name and says so
    # instead of silently calling the fresh instance.
    with pytest.raises(ActorUnavailableError, match="replaced"):
        counter.incr()
    assert counter.incr() == 1  # then it follows the new instance
    assert counter.pid() != first_pid
    assert second.address != first.address


def test_reregistering_a_name_on_a_live_server_is_detected() -> None:
    with ActorServer() as server:
        server.register("counter", Counter())
        counter = ActorClient(FixedResolver({"counter": server.url("counter")}), "counter")
        assert counter.incr() == 1
        server.register("counter", Counter())
        with pytest.raises(ActorUnavailableError, match=r"replaced.*did not run"):
            counter.incr()
        assert counter.incr() == 1


def test_retries_cover_calls_that_were_not_sent() -> None:
    with ActorServer() as server:
        server.register("counter", Counter())

        class FlakyResolver:
            """Knows the actor only from the third lookup on."""

            def __init__(self) -> None:
                self.lookups = 0

            def resolve(self, name: str) -> list[str]:
                self.lookups += 1
                return [server.url(name)] if self.lookups >= 3 else []

        with pytest.raises(ActorUnavailableError, match="not sent"):
            ActorClient(FlakyResolver(), "counter", RpcOptions(retries=1)).incr()
        resolver = FlakyResolver()
        assert ActorClient(resolver, "counter", RpcOptions(retries=2)).incr() == 1
        assert resolver.lookups == 3
        # A URL nobody listens on any more is skipped for the next one.
        dead = ActorServer()
        dead_url = dead.url("counter")
        dead.stop()
        fallback = ActorClient(FixedResolver({"counter": [dead_url, server.url("counter")]}), "counter")
        assert fallback.incr() == 2


def test_ready_future_completes_once_the_actor_is_registered() -> None:
    with ActorServer() as server:
        handle = ActorClient(FixedResolver({"late": server.url("late")}), "late")
        ready = handle._fray_ready()
        assert not ready.done()
        server.register("late", Counter())
        assert ready.result(timeout=30) is None
        assert handle.incr() == 1
    never = ActorClient(FixedResolver({}), "never", RpcOptions(timeout=0.3))._fray_ready()
    with pytest.raises(ActorUnavailableError, match="not ready"):
        never.result(timeout=30)


def test_server_stop_fails_calls_in_flight() -> None:
    server = ActorServer().start()
    server.register("gate", __import__("rpc.actors", fromlist=["Gate"]).Gate(), max_concurrency=2)
    gate = ActorClient(FixedResolver({"gate": server.url("gate")}), "gate")
    future = gate.block_forever.remote()
    wait_until(lambda: gate.running() == 1)
    server.stop()
    with pytest.raises(ActorUnavailableError, match="may or may not have run"):
        future.result(timeout=30)


def test_in_process_registry_serves_resolvers() -> None:
    with ActorServer() as host:
        registry = serve_registry(host)
        with ActorServer(registry=registry) as server:
            server.register("counter", Counter())
            assert registry.resolve("default", "counter") == [server.url("counter")]
            assert ActorClient(ClusterResolver(host.address), "counter").incr() == 1
        assert registry.resolve("default", "counter") == []  # stop() unregisters


def test_calls_queued_behind_a_replaced_actor_do_not_run() -> None:
    from rpc.actors import Gate

    with ActorServer() as server:
        old = Gate()
        server.register("gate", old)
        url = {"gate": server.url("gate")}
        first = ActorClient(FixedResolver(url), "gate")
        blocked = first.wait.remote(30.0)
        wait_until(lambda: old.waiting == 1)
        same_connection = first.open.remote()  # behind the running call on its connection
        second = ActorClient(FixedResolver(url), "gate")  # another connection: waits in the backlog
        queued = [second.open.remote() for _ in range(3)]
        server.register("gate", Gate())
        for future in queued:  # answered at once, while the old instance is still busy
            with pytest.raises(ActorUnavailableError, match="did not run"):
                future.result(timeout=30)
        assert not blocked.done()
        old.open()
        assert blocked.result(timeout=30) is True
        with pytest.raises(ActorUnavailableError, match="did not run"):
            same_connection.result(timeout=30)
        assert old.opened == 1  # only our direct call: no queued open() ran on the old instance


def test_a_fast_answer_does_not_wait_for_a_slow_call_after_it() -> None:
    from rpc.actors import Gate

    with ActorServer() as server:
        gate_obj = Gate()
        server.register("gate", gate_obj)
        gate = ActorClient(FixedResolver({"gate": server.url("gate")}), "gate")
        for _ in range(20):  # pipelined pairs, so both often arrive in one read
            fast, slow = gate.ping.remote(), gate.wait.remote(30.0)
            assert fast.result(timeout=10) == "pong"  # answered while wait() still runs
            assert not slow.done()
            gate_obj.open()
            assert slow.result(timeout=30) is True
            gate_obj._event.clear()
