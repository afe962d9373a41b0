"""A VM's life in the autoscaler: its states, the transitions between them, and its record.

REQUESTED → BOOTING → READY → DRAINING → DELETED, or FAILED (terminal, with a reason:
``preempted``, ``boot_failed``, ``boot_deadline``, ``lost``). Every change goes through
:meth:`VmRecord.move`, which checks :data:`TRANSITIONS`; a slice's VMs always move together.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fray.cluster.protocol.capacity import Device, WorkerInfo
from fray.cluster.server.autoscale.config import ScaleGroup
from fray.errors import FrayError

__all__ = ["FAILURE_REASONS", "TRANSITIONS", "SliceRecord", "VmRecord", "VmState", "vm_worker_info"]


class VmState(enum.Enum):
    """Where a VM is in its life, as the autoscaler sees it (the cloud's view is :class:`CloudState`)."""

    REQUESTED = "REQUESTED"
    """The provider accepted the create and is provisioning the VM."""
    BOOTING = "BOOTING"
    """The VM runs; its Fray worker has not registered yet (or not every host of its slice has)."""
    READY = "READY"
    """Every host of the slice has a registered worker: the scheduler may place work on it."""
    DRAINING = "DRAINING"
    """Idle past ``idle_seconds``: no new work is placed on it; deleted unless it turns out busy."""
    DELETED = "DELETED"
    """Deleted at the provider on purpose (scale-down, ``fray cluster down``)."""
    FAILED = "FAILED"
    """Lost for a reason (see :data:`FAILURE_REASONS`) and deleted at the provider."""


FAILURE_REASONS = ("preempted", "boot_failed", "boot_deadline", "lost")
"""Why a VM is FAILED: reclaimed by the cloud; the cloud failed it while booting; its slice was not
READY within ``boot_timeout``; its worker (or the VM itself) vanished after it was READY."""

TRANSITIONS: dict[VmState, frozenset[VmState]] = {
    VmState.REQUESTED: frozenset({VmState.BOOTING, VmState.READY, VmState.FAILED, VmState.DELETED}),
    VmState.BOOTING: frozenset({VmState.READY, VmState.FAILED, VmState.DELETED}),
    VmState.READY: frozenset({VmState.DRAINING, VmState.FAILED, VmState.DELETED}),
    # A draining VM that turns out busy (or is wanted again) goes back to READY.
    VmState.DRAINING: frozenset({VmState.READY, VmState.FAILED, VmState.DELETED}),
    VmState.DELETED: frozenset(),
    VmState.FAILED: frozenset(),
}
"""The allowed moves; anything else is a bug in the autoscaler (:class:`FrayError`)."""


def _iso(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


@dataclass
class VmRecord:
    """One VM the autoscaler created or adopted (mutable: it is the state machine's current state)."""

    vm_id: str
    slice_id: str
    group: str
    host_index: int
    state: VmState
    created_at: float
    ready_at: float | None = None
    ended_at: float | None = None
    reason: str = ""
    registered: bool = False
    """Whether the VM's worker (worker id = VM id) has registered with the controller."""

    @property
    def finished(self) -> bool:
        """DELETED or FAILED: nothing more happens to it."""
        return not TRANSITIONS[self.state]

    def move(self, to: VmState, now: float, reason: str = "") -> None:
        """Change state, checked against :data:`TRANSITIONS`."""
        if to == self.state:
            return
        if to not in TRANSITIONS[self.state]:
            raise FrayError(f"VM {self.vm_id}: no transition {self.state.value} -> {to.value}")
        if to == VmState.FAILED and reason not in FAILURE_REASONS:
            raise FrayError(f"VM {self.vm_id}: FAILED needs one of {FAILURE_REASONS}, got {reason!r}")
        self.state = to
        self.reason = reason
        if to == VmState.READY and self.ready_at is None:
            self.ready_at = now
        if self.finished:
            self.ended_at = now

    def as_dict(self) -> dict[str, Any]:
        """The ``vm list --json`` row (ISO 8601 UTC times)."""
        return {
            "id": self.vm_id,
            "group": self.group,
            "slice": self.slice_id,
            "state": self.state.value,
            "worker_id": self.vm_id if self.registered else None,
            "created_at": _iso(self.created_at),
            "ready_at": _iso(self.ready_at),
            "reason": self.reason or None,
        }


@dataclass
class SliceRecord:
    """The VMs of one slice, which move through their states together (a single VM is a slice of one)."""

    slice_id: str
    group: str
    vms: list[VmRecord]
    created_at: float
    idle_since: float | None = None
    drain_started: float | None = None

    @property
    def state(self) -> VmState:
        """The slice's state: every one of its VMs is in it."""
        return self.vms[0].state

    def move(self, to: VmState, now: float, reason: str = "") -> None:
        """Move every VM of the slice (checked against :data:`TRANSITIONS`)."""
        for vm in self.vms:
            vm.move(to, now, reason)


def vm_worker_info(group: ScaleGroup, vm_id: str, slice_id: str, host_index: int) -> WorkerInfo:
    """What the worker of a VM of ``group`` declares: the group's resources and the VM's attributes.

    The providers start workers with exactly this (``--id VM_ID``, the group's resources,
    ``scale-group``, ``vm``, ``preemptible`` and, for slices, ``tpu-name``/``tpu-worker-id``);
    the scale simulation and the tests register it in their place.
    """
    res = group.resources
    devices = []
    for text in res.devices:
        kind, dtype, count = text.split(":")
        devices.append(Device(kind, dtype, int(count)))
    attributes = {"scale-group": group.name, "vm": vm_id, "preemptible": "true" if group.preemptible else "false"}
    if group.is_slice:  # a single-host TPU VM is a slice of its own without them
        attributes["tpu-name"] = slice_id
        attributes["tpu-worker-id"] = str(host_index)
    return WorkerInfo(vm_id, round(res.cpu * 1000), res.ram_bytes, res.disk_bytes, tuple(devices), attributes)
