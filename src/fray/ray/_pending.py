"""Why a Ray job is still pending: its request compared with the nodes Ray has (Ray itself only waits).

Ray queues a task that no node can hold (an "infeasible" task) without a word to the
driver, and a placement group that does not fit likewise. Fray words it from
``ray.nodes()`` (what each alive node has) and ``ray.available_resources()`` (what is
free now), for :meth:`fray.ray.jobs.RayJobHandle.info` and the pending notice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["placement_reason"]

# Fray pins work with a token amount of a marker resource: it says where, not how much,
# so it is checked but not shown as something the job needs.
_TOKEN = 0.01


def _amount(name: str, value: float) -> str:
    if name in ("memory", "object_store_memory"):
        return f"{value / 2**30:.3g} GiB {name}"
    return f"{value:g} {name}"


def _describe(resources: Mapping[str, float], keys: Mapping[str, float]) -> str:
    shown = [_amount(name, resources.get(name, 0.0)) for name, need in keys.items() if need >= _TOKEN]
    return ", ".join(shown) or "nothing"


def _node_name(node: Mapping[str, Any]) -> str:
    return f"node {node.get('NodeManagerAddress', '?')}"


def _fits(resources: Mapping[str, float], need: Mapping[str, float]) -> int:
    """How many replicas needing ``need`` fit in ``resources``."""
    counts = [math.floor(resources.get(name, 0.0) / value + 1e-9) for name, value in need.items() if value > 0]
    return min(counts) if counts else 1_000_000


def placement_reason(need: Mapping[str, float], replicas: int) -> str:
    """Why ``replicas`` replicas each needing ``need`` (a Ray bundle) do not run now; "" if they fit now."""
    import ray

    nodes = [node for node in ray.nodes() if node.get("Alive")]
    if not nodes:
        return "Ray has no alive node"
    totals = [dict(node.get("Resources", {})) for node in nodes]
    per_replica = _describe(need, need)
    for name, value in need.items():
        best = max(range(len(nodes)), key=lambda i: totals[i].get(name, 0.0))
        if totals[best].get(name, 0.0) + 1e-9 < value:
            have = totals[best].get(name, 0.0)
            where = f" on {_node_name(nodes[best])}" if have else ""
            return (
                f"needs {per_replica} per replica; no Ray node has {_amount(name, value)} "
                f"(largest: {_amount(name, have)}{where})"
            )
    top = max(range(len(nodes)), key=lambda i: _fits(totals[i], need))
    largest = f"largest node: {_describe(totals[top], need)} on {_node_name(nodes[top])}"
    room = sum(_fits(total, need) for total in totals)
    if room < replicas:
        return f"gang of {replicas} replicas of {per_replica}: Ray's nodes hold at most {room} ({largest})"
    free = ray.available_resources()
    if _fits(free, need) >= replicas:
        return ""
    return f"waiting for capacity: needs {replicas} x {per_replica}; free now {_describe(free, need)} ({largest})"
