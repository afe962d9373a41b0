"""The VM provider protocol: what the autoscaler asks of a cloud (or of the simulated one).

A provider creates, lists and deletes *slices*: groups of VMs created, booted and
deleted as one unit (a TPU slice of several hosts, or a single VM, which is a slice of
one). The autoscaler names everything itself (slice ids and VM ids are chosen by the
caller, and carry the cluster's label), so that

* a create is idempotent by its ``request_id``: repeating it after a timeout or a
  controller restart never makes a second slice;
* after a controller restart, :meth:`Provider.list_vms` is the truth: the autoscaler
  adopts the cluster's VMs it finds and deletes what it no longer wants.

Providers never block scheduling: the autoscaler calls them from its own thread.
Errors are the typed :class:`~fray.errors.ProviderError` family:
:class:`~fray.errors.QuotaExceeded` (the group is blocked for a while and its demand
goes to the next group), :class:`~fray.errors.CapacityUnavailable` (try later or
elsewhere) and :class:`~fray.errors.VmNotFound`.

A provider only reports what the *cloud* knows (:class:`CloudState`); whether a VM's
Fray worker has registered (BOOTING versus READY) is the autoscaler's business.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = [
    "CLUSTER_LABEL",
    "CloudState",
    "Provider",
    "ProviderVm",
    "SliceRequest",
    "VmResources",
]

CLUSTER_LABEL = "fray-cluster"
"""The label every VM of a Fray cluster carries; its value is the cluster's name. Listing filters on it."""


class CloudState(enum.Enum):
    """A VM's state as the provider sees it (not whether its worker has joined)."""

    CREATING = "creating"
    """Asked for; the cloud is provisioning it."""
    RUNNING = "running"
    """The VM is up; its start-up script is (or was) starting the Fray worker."""
    PREEMPTED = "preempted"
    """The cloud reclaimed it (spot/preemptible VMs, maintenance): its worker is gone without notice."""
    FAILED = "failed"
    """The cloud could not create or keep it (a boot error on the cloud's side)."""
    DELETING = "deleting"
    """A delete was asked for and is in progress."""


@dataclass(frozen=True)
class VmResources:
    """What each VM of a slice offers to Fray's scheduler (its worker declares exactly this)."""

    cpu: float
    ram_bytes: int
    disk_bytes: int
    devices: tuple[str, ...] = ()
    """Accelerators as ``KIND:TYPE:COUNT`` (the ``fray worker --device`` spelling), e.g. ``tpu:v4-16:4``."""


@dataclass(frozen=True)
class SliceRequest:
    """One slice to create: ``len(vm_ids)`` VMs of one scale group, booted and deleted together."""

    request_id: str
    """Idempotency key: a second create with the same id returns the first one's VMs."""
    group: str
    slice_id: str
    vm_ids: tuple[str, ...]
    """One id per host, in host order; host ``i`` is ``tpu-worker-id=i`` in a multi-host slice."""
    resources: VmResources
    attributes: Mapping[str, str] = field(default_factory=dict)
    """Attributes every VM's worker declares (``scale-group``, ``preemptible``, ``tpu-name`` for slices ...);
    the provider adds the per-VM ones (``vm=ID``, ``tpu-worker-id=I``)."""
    preemptible: bool = False


@dataclass(frozen=True)
class ProviderVm:
    """One VM as the provider lists it."""

    vm_id: str
    slice_id: str
    group: str
    host_index: int
    state: CloudState
    created_at: float
    """Wall-clock seconds (``time.time()``) when the create was accepted."""
    reason: str = ""
    """Why the VM is FAILED or PREEMPTED, in the provider's words."""


@runtime_checkable
class Provider(Protocol):
    """Creates, lists and deletes slices of VMs. Every method may be called from any thread."""

    kind: str
    """The ``provider.kind`` of the cluster file: ``"simulated"`` or ``"gcp"``."""

    def create_slice(self, request: SliceRequest) -> Sequence[ProviderVm]:
        """Create the slice's VMs (idempotent by ``request.request_id``).

        Raises :class:`~fray.errors.QuotaExceeded` or
        :class:`~fray.errors.CapacityUnavailable`; then nothing was created.
        """
        ...

    def list_vms(self) -> Sequence[ProviderVm]:
        """Every VM of this cluster the provider knows (deleted ones excluded)."""
        ...

    def delete_slice(self, slice_id: str) -> None:
        """Delete every VM of the slice. Deleting a slice that is already gone is not an error."""
        ...

    def close(self) -> None:
        """Release the provider's own resources (clients, threads). The VMs stay as they are."""
        ...


def slice_vms(vms: Sequence[ProviderVm]) -> Mapping[str, tuple[ProviderVm, ...]]:
    """The VMs grouped by slice id, each slice's VMs in host order."""
    by_slice: dict[str, list[ProviderVm]] = {}
    for vm in vms:
        by_slice.setdefault(vm.slice_id, []).append(vm)
    return {sid: tuple(sorted(group, key=lambda v: v.host_index)) for sid, group in by_slice.items()}
