"""The one way Fray writes a moment for people: ``2026-11-29 06:20:00 UTC`` (to the second, always UTC).

The command line, the autoscaler's states and reasons, and the CLI's tables all use it, so
times from the controller, the VMs and the jobs line up whatever the reader's time zone.
Machine-readable output (``--json``, the operator API) keeps epoch seconds or ISO 8601.
"""

from __future__ import annotations

import time

__all__ = ["format_time"]


def format_time(at: float | None) -> str:
    """``at`` (seconds since the epoch) as ``YYYY-MM-DD HH:MM:SS UTC`` ("" for None)."""
    return "" if at is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
