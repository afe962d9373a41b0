"""The one timer form every Fray timer uses (call timeouts, job timeouts, CPU lending)."""

from __future__ import annotations

import os
import threading
import time

from fray.core._deadlines import Deadlines


def test_actions_run_in_deadline_order_not_in_scheduling_order() -> None:
    deadlines = Deadlines("test-deadlines")
    ran: list[str] = []
    all_ran = threading.Event()

    def record(name: str) -> None:
        ran.append(name)
        if len(ran) == 3:
            all_ran.set()

    now = time.monotonic()
    deadlines.schedule(now + 0.3, lambda: record("third"))
    deadlines.schedule(now + 0.1, lambda: record("first"))
    deadlines.schedule(now + 0.2, lambda: record("second"))
    assert all_ran.wait(10)
    assert ran == ["first", "second", "third"]


def test_an_action_is_not_run_before_its_deadline() -> None:
    deadlines = Deadlines("test-deadlines")
    ran_at: list[float] = []
    done = threading.Event()
    due = time.monotonic() + 0.2
    deadlines.schedule(due, lambda: (ran_at.append(time.monotonic()), done.set()))
    assert done.wait(10)
    assert ran_at[0] >= due


def test_an_action_that_raises_does_not_stop_the_later_ones() -> None:
    deadlines = Deadlines("test-deadlines")
    later = threading.Event()

    def fail() -> None:
        raise RuntimeError("boom")

    now = time.monotonic()
    deadlines.schedule(now, fail)
    deadlines.schedule(now + 0.05, later.set)
    assert later.wait(10)


def test_a_forked_child_runs_its_own_actions_and_forgets_the_parents() -> None:
    deadlines = Deadlines("test-deadlines")
    started = threading.Event()
    deadlines.schedule(time.monotonic(), started.set)  # the parent's thread is running at the fork
    assert started.wait(10)
    parent_ran = threading.Event()
    deadlines.schedule(time.monotonic() + 0.5, parent_ran.set)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            forgotten = not deadlines._heap  # the parent's pending action acts on the parent's state
            child_ran = threading.Event()
            deadlines.schedule(time.monotonic(), child_ran.set)  # needs a thread of the child's own
            code = 0 if forgotten and child_ran.wait(10) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent_ran.wait(10)  # and the parent still runs its own
