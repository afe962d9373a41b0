"""The deferred part of the actor handles (fray.core._deferred_calls): order, death, restarts and retries.

The cluster's and Iris's handles are built on it; the conformance suite checks them end to
end. These tests pin down the rules the handles rely on, with a recording ``send``.
"""

from __future__ import annotations

import threading

import pytest

from fray.actor import ActorFuture
from fray.core._deferred_calls import TRANSITIONS, CallState, DeferredCalls, PendingCall
from fray.errors import ActorDiedError


class Recorder:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, call: PendingCall) -> None:
        with self.lock:
            self.sent.append(call.method)
        call.future.set_result(call.method)


def call(name: str) -> PendingCall:
    return PendingCall(ActorFuture(), name, ((), {}))


def test_calls_wait_until_the_actor_serves_then_go_in_the_order_they_were_made() -> None:
    send = Recorder()
    calls = DeferredCalls(send)
    assert calls.submit(call("a")) and calls.submit(call("b"))
    assert send.sent == [] and not calls.ready.done()
    # Calls made while the queue drains join its end: none overtakes an earlier one.
    made: list[str] = []

    def maker() -> None:
        for i in range(200):
            made.append(f"m{i}")
            calls.submit(call(f"m{i}"))

    thread = threading.Thread(target=maker)
    thread.start()
    calls.serve()
    thread.join()
    assert send.sent == ["a", "b", *made]
    assert calls.state is CallState.SERVING and calls.ready.result() is None
    assert not calls.submit(call("later")) and send.sent[-1] == "later"


def test_a_dead_actor_fails_every_waiting_and_later_call_with_its_own_copy() -> None:
    calls = DeferredCalls(Recorder())
    waiting = [call("a"), call("b")]
    for c in waiting:
        calls.submit(c)
    calls.die(ActorDiedError("actor 'x' died"))
    later = call("c")
    calls.submit(later)
    errors = [c.future.exception() for c in [*waiting, later]]
    assert all(isinstance(e, ActorDiedError) and "actor 'x' died" in str(e) for e in errors)
    assert len({id(e) for e in errors}) == 3  # one object raised from many threads tangles its traceback
    assert isinstance(calls.ready.exception(), ActorDiedError)
    calls.serve()  # the death is final: a late "serving" changes nothing
    assert calls.state is CallState.DEAD


def test_a_restart_makes_calls_wait_again_and_a_call_is_sent_again_within_its_budget() -> None:
    send = Recorder()
    calls = DeferredCalls(send)
    calls.serve()
    assert calls.restarting() and not calls.restarting()  # a second broken call finds it done
    in_flight = call("retried")
    calls.retry(in_flight, ActorDiedError("died in flight"), max_task_retries=1)
    assert send.sent == [] and in_flight.retries == 1
    calls.serve()
    assert send.sent == ["retried"] and in_flight.future.result() == "retried"
    again = call("again")
    again.retries = 1
    died = ActorDiedError("died in flight again")
    calls.retry(again, died, max_task_retries=1)
    assert again.future.exception() is died


def test_the_transition_table_is_enforced() -> None:
    assert TRANSITIONS[CallState.DEAD] == frozenset()
    calls = DeferredCalls(Recorder())
    calls.die(ActorDiedError("gone"))
    with pytest.raises(RuntimeError, match="no transition from dead to waiting"), calls._lock:
        calls._move(CallState.WAITING)
