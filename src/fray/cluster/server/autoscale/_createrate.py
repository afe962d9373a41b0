"""A scale group's create rate: a token bucket whose rate drops on boot failures and climbs back over time.

Each slice that fails to boot multiplies the rate by ``factor`` (down to ``floor``) and shrinks
the bucket with it, so a throttled group cannot burst; the rate then climbs back *linearly*
to ``base`` over ``recovery_seconds``. Unlike an exponential backoff, one failure among many
good boots costs a little speed, not a long stop, and recovery does not wait for a timer to
expire (the saw-tooth of marin#5699).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CreateRate"]


@dataclass
class CreateRate:
    """How many slices a group may create now (mutable: it is the group's current rate and bucket)."""

    base: float
    """Slices per second of a healthy group."""
    burst: float
    """Creates a healthy group may make at once."""
    factor: float
    floor: float
    recovery_seconds: float
    updated: float
    rate: float = 0.0
    tokens: float = 0.0
    failures: int = 0

    def __post_init__(self) -> None:
        self.rate = self.rate or self.base
        self.tokens = self.tokens or self.burst

    @property
    def throttled(self) -> bool:
        """Whether boot failures have lowered the rate below ``base``."""
        return self.rate < self.base

    def _bucket(self) -> float:
        return max(1.0, self.burst * self.rate / self.base)

    def advance(self, now: float) -> None:
        """Let time pass: the rate recovers, the bucket refills."""
        elapsed = max(0.0, now - self.updated)
        self.updated = max(self.updated, now)
        self.rate = min(self.base, self.rate + (self.base - self.floor) * elapsed / self.recovery_seconds)
        self.tokens = min(self._bucket(), self.tokens + self.rate * elapsed)

    def boot_failed(self, now: float) -> None:
        """A slice failed to boot: the rate drops by ``factor`` (not below ``floor``)."""
        self.advance(now)
        self.failures += 1
        self.rate = max(self.floor, self.rate * self.factor)
        self.tokens = min(self.tokens, self._bucket())

    def take(self) -> bool:
        """Use one create if the bucket has one (call :meth:`advance` first)."""
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
