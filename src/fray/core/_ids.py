"""Random hex digits for ids that must be unique, not secret (job ids, attempt keys).

``uuid.uuid4`` reads ``os.urandom`` on every call, a system call that also lets go of the
GIL: in a driver whose other threads are busy (Ray's, Fray's reaper) getting it back can
cost more than the rest of a submit. A PRNG seeded once from the OS is as unique. It is
seeded again in a forked child, which would otherwise draw the very ids of its parent;
the module-level ``random`` functions are not used, since a script may seed those.
"""

from __future__ import annotations

import os
import random

__all__ = ["random_hex"]

_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def random_hex(digits: int) -> str:
    """``digits`` random lowercase hex digits."""
    return f"{_ids.getrandbits(4 * digits):0{digits}x}"
