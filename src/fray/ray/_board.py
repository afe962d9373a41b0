"""Which jobs moved on, so that whoever waits for many of them looks again at those only.

A job moves on when a replica completes, a new attempt starts, or the job finishes.
Jobs join the board the first time they are waited on through it and stay, so waiting
again costs no registration (``fray.wait_all`` waits again after every job that
finishes: a registration per job and wait would cost quadratic time in the number of
jobs).
"""

from __future__ import annotations

import threading
from typing import Protocol

__all__ = ["BOARD", "Board", "Movable"]


class Movable(Protocol):
    """What the board records about a job: the generation at which it last moved on."""

    _moved: int


class Board:
    """A generation counter: every move increments it, wakes every waiter, and marks the job."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.generation = 0

    def moved(self, job: Movable) -> None:
        """``job`` may have moved on; marked under the lock, so no waiter can miss it."""
        with self._changed:
            self.generation += 1
            job._moved = self.generation
            self._changed.notify_all()

    def wait(self, generation: int, timeout: float | None) -> None:
        """Block until some job moved after ``generation`` was read, or ``timeout`` passed."""
        with self._changed:
            if self.generation == generation:
                self._changed.wait(timeout)


BOARD = Board()
