"""fray.core._lending: a job's CPU is lent once however many of its threads block, and only for waits that last."""

from __future__ import annotations

import threading

from fray.core._lending import LEND_AFTER, blocked, lending_to
from support import wait_until


class Recording:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def lend(self) -> None:
        self.calls.append("lend")

    def reclaim(self) -> None:
        self.calls.append("reclaim")


def test_a_short_wait_lends_nothing():
    lender = Recording()
    with lending_to(lender):
        for _ in range(100):
            with blocked():
                pass
    assert lender.calls == []


def test_a_long_wait_lends_once_and_takes_it_back_when_it_ends():
    lender = Recording()
    release = threading.Event()
    with lending_to(lender), blocked():
        wait_until(lambda: lender.calls == ["lend"], what="the CPU to be lent")
        release.wait(LEND_AFTER)  # still blocked: nothing more happens
        assert lender.calls == ["lend"]
    assert lender.calls == ["lend", "reclaim"]


def test_several_blocked_threads_of_one_job_lend_once_the_last_to_resume_reclaims():
    lender = Recording()
    resume = [threading.Event() for _ in range(3)]
    inside = threading.Barrier(4)

    def waiter(event: threading.Event) -> None:
        with blocked():
            inside.wait(10)
            event.wait(10)

    with lending_to(lender, process_wide=True):
        threads = [threading.Thread(target=waiter, args=(e,)) for e in resume]
        for thread in threads:
            thread.start()
        inside.wait(10)
        wait_until(lambda: lender.calls == ["lend"], what="the CPU to be lent")
        resume[0].set()
        resume[1].set()
        threads[0].join(10)
        threads[1].join(10)
        assert lender.calls == ["lend"]  # one thread still blocks
        resume[2].set()
        threads[2].join(10)
    assert lender.calls == ["lend", "reclaim"]
