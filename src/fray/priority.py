"""Priority bands: where a job or actor stands in the queue of a backend that orders by them (Iris's numbers).

``JobRequest.priority`` and ``ActorConfig.priority`` take a :class:`PriorityBand`; the client
resolves ``INHERIT`` at submit (:func:`fray.job_info.effective_band`), so a backend always sees
1, 2 or 3. What each backend does with it is in ``docs/scheduler.md`` ("Priority bands").
"""

from __future__ import annotations

from enum import IntEnum

from fray.errors import ConfigError

__all__ = ["TOP_LEVEL_BAND", "PriorityBand", "check_band"]


class PriorityBand(IntEnum):
    """A job's priority band, with Iris's numbers (``JobRequest.priority``, ``ActorConfig.priority``).

    Better bands are placed first and, on a Fray cluster, may preempt running work of a worse
    band (``docs/scheduler.md``, "Priority bands"). ``INHERIT`` (0, the default) takes the band of the job that
    submits: a top-level submit (from a script, not from inside a job) is ``INTERACTIVE``.
    """

    INHERIT = 0
    PRODUCTION = 1
    INTERACTIVE = 2
    BATCH = 3

    @property
    def label(self) -> str:
        """``"production"``, ``"interactive"``, ``"batch"`` (``"inherit"`` for 0)."""
        return self.name.lower()


#: What a top-level job (submitted from outside any job) gets for ``priority=0``.
TOP_LEVEL_BAND = PriorityBand.INTERACTIVE


def check_band(value: object, owner: str) -> PriorityBand:
    """``value`` as a :class:`PriorityBand`; ConfigError naming ``owner(priority=...)`` and the bands otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in PriorityBand._value2member_map_:
        raise ConfigError(
            f"{owner}(priority={value!r}) is not a priority band: use 1 (production), 2 (interactive), 3 (batch), "
            "or 0 to inherit the submitting job's band (interactive for a top-level job); fray.PriorityBand names them"
        )
    return PriorityBand(value)
