"""The Monarch task pool's lock discipline: a call that finished before it is watched must not deadlock.

Monarch's bridge can settle a call while the pool is still sending it (the reply is
already there when the callback is attached), so ``add_done_callback`` runs the
callback at once, on the sending thread. These tests give the pool runners whose
calls are finished when returned, which makes that race certain instead of rare
(it hung ``test_refs_as_arguments_are_resolved_at_top_level_and_one_level_in[monarch]``
once in a fresh-clone run).
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

from fray.monarch.context import _Pool


class _Remote:
    def __init__(self, fail: BaseException | None) -> None:
        self.fail = fail

    def remote(self, fn: Any, args: Any, kwargs: Any, context: Any, rank: int, task_id: str) -> Any:
        if self.fail is not None:
            raise self.fail
        call: concurrent.futures.Future[Any] = concurrent.futures.Future()
        call.set_result(fn(*args, **kwargs))
        return call


class _FinishedAtOnce:
    """A runner whose calls are done before the pool watches them."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.run = _Remote(fail)


def _pool(ranks: int, fail: BaseException | None = None) -> _Pool:
    return _Pool(None, "pool", [_FinishedAtOnce(fail) for _ in range(ranks)], concurrent.futures.ThreadPoolExecutor(1))


def _in_thread(work: Any) -> None:
    """Run ``work`` on a thread and fail (instead of hanging the suite) if it does not return."""
    finished = threading.Event()

    def run() -> None:
        work()
        finished.set()

    threading.Thread(target=run, daemon=True).start()
    assert finished.wait(30), "the pool deadlocked on its own lock"


def test_tasks_whose_calls_finish_at_once_all_complete() -> None:
    pool = _pool(2)
    futures: list[concurrent.futures.Future[Any]] = [concurrent.futures.Future() for _ in range(20)]

    def submit_all() -> None:
        for index, future in enumerate(futures):
            pool.submit((lambda x: x * 2, (index,), {}, future, "double", f"t{index}"), None)

    _in_thread(submit_all)
    assert [future.result(0) for future in futures] == [index * 2 for index in range(20)]
    assert pool.busy == [False, False] and not pool.queue


def test_a_ref_finished_by_its_call_may_start_the_next_task_from_its_callback() -> None:
    # A task waiting on a ref is submitted from the ref's done callback: with the
    # pool's lock still held there, the second submit would wait forever.
    pool = _pool(1)
    first: concurrent.futures.Future[Any] = concurrent.futures.Future()
    second: concurrent.futures.Future[Any] = concurrent.futures.Future()
    first.add_done_callback(
        lambda done: pool.submit((lambda x: x + 1, (done.result(),), {}, second, "next", "t2"), None)
    )
    _in_thread(lambda: pool.submit((lambda: 41, (), {}, first, "first", "t1"), None))
    assert second.result(0) == 42


def test_a_call_that_cannot_be_sent_fails_its_task_and_the_tasks_waiting_on_it() -> None:
    pool = _pool(1, fail=RuntimeError("cannot send"))
    first: concurrent.futures.Future[Any] = concurrent.futures.Future()
    second: concurrent.futures.Future[Any] = concurrent.futures.Future()
    first.add_done_callback(lambda done: pool.submit((lambda: None, (), {}, second, "next", "t2"), None))
    _in_thread(lambda: pool.submit((lambda: None, (), {}, first, "first", "t1"), None))
    assert isinstance(first.exception(0), RuntimeError)
    assert isinstance(second.exception(0), RuntimeError)
