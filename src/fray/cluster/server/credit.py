"""Credit accounting: how much each user has, what running work costs, what a user bids.

Every user starts with ``CreditPolicy.initial_credit``. Running tasks cost credits
at a constant *rate* (credits per second) that depends only on what the task asked
for::

    rate = cpu_cores * cpu_weight
         + ram_GiB   * ram_gib_weight
         + gpus      * gpu_weight
         + tpu_chips * tpu_chip_weight

The balance regenerates slowly (``regen_per_second``) but never above the initial
credit, and may go negative: credit only *orders* jobs, it never refuses them. Over
an interval of ``dt`` seconds in which a user's running tasks cost ``used`` credits::

    balance' = min(initial_credit, balance + regen_per_second * dt - used)

The scheduler uses a user's *bid*, the balance they would have left after
``horizon`` more seconds of their current work::

    bid = balance - horizon * (sum of rates of the user's running tasks)

so a user who has just started a large sweep drops behind a user with a single run
at once, not only after the sweep has drained their balance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fray.errors import ConfigError

__all__ = ["CreditPolicy", "bid", "settle", "task_rate"]

_GIB = float(1 << 30)


@dataclass(frozen=True)
class CreditPolicy:
    """The constants of the credit formula (see the module docstring).

    The defaults make one credit one core-second: a new user holds about 28 core-hours
    (or 1.7 GPU-hours), and an idle user is back to full after a day.
    """

    initial_credit: float = 100_000.0
    regen_per_second: float = 100_000.0 / 86_400.0
    cpu_weight: float = 1.0
    ram_gib_weight: float = 0.125
    gpu_weight: float = 16.0
    tpu_chip_weight: float = 16.0

    def __post_init__(self) -> None:
        for name in (
            "initial_credit",
            "regen_per_second",
            "cpu_weight",
            "ram_gib_weight",
            "gpu_weight",
            "tpu_chip_weight",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"CreditPolicy({name}={value!r}) must be a finite number >= 0")


def task_rate(cpu_millis: int, ram_bytes: int, device_kind: str, device_count: int, policy: CreditPolicy) -> float:
    """Credits per second that one running task with these resources costs."""
    rate = cpu_millis / 1000.0 * policy.cpu_weight + ram_bytes / _GIB * policy.ram_gib_weight
    if device_kind == "gpu":
        rate += device_count * policy.gpu_weight
    elif device_kind == "tpu":
        rate += device_count * policy.tpu_chip_weight
    return rate


def settle(balance: float, elapsed: float, used: float, policy: CreditPolicy) -> float:
    """The balance after ``elapsed`` seconds of regeneration and ``used`` credits of usage."""
    # The cap limits regeneration only; a balance an operator set above it is kept.
    cap = max(policy.initial_credit, balance)
    return min(cap, balance + policy.regen_per_second * max(0.0, elapsed) - used)


def bid(balance: float, running_rate: float, horizon: float) -> float:
    """What a user bids: the balance left after ``horizon`` more seconds of their running work."""
    return balance - horizon * running_rate
