"""What the autoscaler tells people: each scale group's state, and why each pending job waits.

:class:`~fray.cluster.server.autoscale.autoscaler.Autoscaler` keeps a :class:`GroupState` per scale group;
after each tick it turns them, its slices and the tick's routing into the pending reasons of
jobs (:func:`job_notes`) and the status ``fray cluster status`` shows (:func:`autoscaler_status`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fray.cluster.server.autoscale._createrate import CreateRate
from fray.cluster.server.autoscale._demand import Routing
from fray.cluster.server.autoscale._vmstate import SliceRecord, VmState
from fray.cluster.server.autoscale.config import ScaleGroup
from fray.core._timefmt import format_time

__all__ = ["BOOTING", "GroupState", "autoscaler_status", "job_notes"]

#: The states of a slice that is on its way (created, not READY yet).
BOOTING = (VmState.REQUESTED, VmState.BOOTING)
# Unmet-demand entries listed in full by status(); the rest are counted by code.
_STATUS_UNMET = 100


@dataclass
class GroupState:
    """A group's create rate and whether (and why) it is blocked after a provider refusal."""

    rate: CreateRate
    blocked_until: float = 0.0
    blocked_code: str = ""
    blocked_message: str = ""
    last_error: str = ""
    wanted: int = 0  # slices wanted in the last tick but not created (rate-limited)


def job_notes(
    routing: Routing,
    slices: Iterable[SliceRecord],
    groups: Mapping[str, GroupState],
    configs: Mapping[str, ScaleGroup],
) -> dict[str, str]:
    """job id -> its pending reason as the autoscaler sees it (waiting for VMs, or why demand is unmet)."""
    booting: dict[str, int] = {}
    for s in slices:
        if s.state in BOOTING:
            booting[s.group] = booting.get(s.group, 0) + 1
    by_group: dict[str, str] = {}
    for name in set(routing.served.values()):
        count = booting.get(name, 0)
        wanted = groups[name].wanted
        unit = "slice" if configs[name].is_slice else "VM"
        parts = [f"is starting {count} {unit}{'s' if count != 1 else ''}"] if count else []
        if wanted:
            parts.append(f"will create {wanted} more (create rate limited)")
        if not parts:
            parts.append(f"keeps a draining {unit} for it")
        by_group[name] = f"waiting for capacity: scale group {name} {' and '.join(parts)}"
    notes = {job_id: by_group[name] for job_id, name in routing.served.items()}
    texts: dict[int, str] = {}
    for job_id, unmet in routing.unmet.items():
        text = texts.get(id(unmet))
        if text is None:
            prefix = "can never be scheduled: " if unmet.never else "waiting for capacity: "
            text = texts[id(unmet)] = f"{prefix}[{unmet.code}] {unmet.message}"
        notes[job_id] = text
    return notes


def autoscaler_status(
    provider_kind: str,
    configs: Sequence[ScaleGroup],
    groups: Mapping[str, GroupState],
    slices: Iterable[SliceRecord],
    counts: Mapping[str, int],
    routing: Routing,
    *,
    stopped: bool,
    ticks: int,
    now: float,
) -> dict[str, Any]:
    """Per group (``configs`` by priority) its state, target and VMs by state; unmet demand with its codes."""
    slices = list(slices)
    rows = []
    for config in configs:
        group = groups[config.name]
        states: dict[str, int] = {}
        for s in slices:
            if s.group == config.name:
                states[s.state.value] = states.get(s.state.value, 0) + len(s.vms)
        if stopped:
            state = "stopped"
        elif group.blocked_until > now:
            state = f"{group.blocked_message} until {format_time(group.blocked_until)}"
        elif group.rate.throttled:
            state = f"backoff ({group.rate.failures} boot failures)"
        else:
            state = "ok"
        target = counts[config.name] + routing.new_slices.get(config.name, 0)
        rows.append(
            {
                "name": config.name,
                "priority": config.priority,
                "hosts": config.hosts,
                "min": config.min,
                "max": config.max,
                "state": state,
                "target": max(config.min, min(config.max, target)),
                "slices": counts[config.name],
                "vms": states,
                "create_rate_per_minute": round(group.rate.rate * 60, 3),
                "last_error": group.last_error,
            }
        )
    unmet_codes: dict[str, int] = {}
    unmet: list[dict[str, Any]] = []
    for job_id, entry in routing.unmet.items():
        unmet_codes[entry.code] = unmet_codes.get(entry.code, 0) + 1
        if len(unmet) < _STATUS_UNMET:
            unmet.append(entry.as_dict(job_id))
    return {
        "provider": provider_kind,
        "groups": rows,
        "unmet": unmet,
        "unmet_count": len(routing.unmet),
        "unmet_by_code": unmet_codes,
        "waiting_for_vms": len(routing.served),
        "ticks": ticks,
    }
