"""Work that never ends, for tests/test_pytest_plugin.py: importable by a cluster's workers (tests/ is on their path)."""

from __future__ import annotations

import threading


def hung_here(flag: int) -> None:
    threading.Event().wait()  # never set: the job is stuck here


def actor_stuck_in_its_method() -> None:
    threading.Event().wait()


class Stuck:
    def block(self) -> None:
        actor_stuck_in_its_method()
