"""The ``gcp`` VM provider: TPU VMs and GCE instances through Google's own client libraries.

Install with ``pip install 'fray[gcp]'`` (``google-cloud-tpu`` and ``google-cloud-compute``,
both over their REST transport). The cluster file's ``provider:`` keys:

``project`` (required), ``zone`` (required)
    Where every VM of the cluster lives.
``runtime_version``
    The TPU VM software version of TPU groups (default ``tpu-ubuntu2204-base``).
``machine_type`` / ``machine_types``
    The GCE machine type of groups without a TPU: one for all (``n2-standard-8``), and/or
    a mapping from group name to type that overrides it. A non-TPU group with neither is
    a ConfigError.
``image``
    The boot image of GCE instances (default ``projects/debian-cloud/global/images/family/debian-12``);
    the boot disk is the group's ``disk``.
``network``
    The VPC network (default ``default``). VMs get an external IP (so that the start-up
    script can install Fray and reach the controller) unless ``external_ip: false``.
``install``
    The shell command the start-up script runs when ``fray`` is not on the VM yet, e.g.
    ``python3 -m pip install 'fray[gcp] @ git+https://…'`` (default: none; then the image
    must have Fray, and a VM without it fails its boot, saying so).
``create_wait``
    Seconds a create waits for Google's operation, so that quota and stock-out errors that
    Google reports in the operation still reach the autoscaler as errors (default 10;
    0 returns at once). Errors reported later show in the listing as FAILED VMs.
``boot_timeout``, ``quota_block_seconds``
    Read by the autoscaler: seconds from create to the VM's worker joining (default 600),
    and how long a quota error blocks a group (default 300).

A group whose device is ``tpu:TYPE:N`` becomes one TPU node per slice (node id = slice
id, ``acceleratorType`` = TYPE, its hosts are the slice's VMs; host ``i`` reads its index
from the TPU metadata ``agent-worker-number``). Other groups become one GCE instance per
VM (instance name = VM id), inserted with a ``requestId`` derived from the slice's
request id, so a repeated create makes no second instance. Every node and instance
carries the labels ``fray-cluster`` (the cluster's name), ``fray-group`` and
``fray-slice``: :meth:`GcpProvider.list_vms` lists only this cluster's VMs, and after a
controller restart it lists the ones to adopt.

Each VM's start-up script (metadata ``startup-script``) runs ``install`` if Fray is missing and
starts ``fray worker --controller HOST:PORT --join TOKEN --id VM_ID ...`` declaring the
group's resources and the attributes ``scale-group``, ``vm``, ``preemptible`` and, for
TPU nodes and multi-host slices, ``tpu-name`` and ``tpu-worker-id``. The join token is
passed in the VM's metadata (``fray-join-token``), not in the script's text.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fray.cluster.server.autoscale._gcp_requests import (
    DEFAULT_BOOT_TIMEOUT,
    GROUP_LABEL,
    SLICE_LABEL,
    GcpSettings,
    gce_insert_requests,
    planned_calls,
    planned_request,
    startup_script,
    tpu_create_request,
    tpu_type,
    vm_ids_of,
)
from fray.cluster.server.autoscale.config import ClusterConfig
from fray.cluster.server.autoscale.provider import CLUSTER_LABEL, CloudState, ProviderVm, SliceRequest
from fray.errors import CapacityUnavailable, ConfigError, ProviderError, QuotaExceeded, VmNotFound

__all__ = [
    "DEFAULT_BOOT_TIMEOUT",
    "GROUP_LABEL",
    "SLICE_LABEL",
    "GcpProvider",
    "GcpSettings",
    "from_config",
    "planned_calls",
    "planned_request",
    "startup_script",
]

_POLL_SECONDS = 0.5
# TPU node states (google.cloud.tpu.v2 Node.State) as the cloud states Fray acts on.
_TPU_STATES = {
    "CREATING": CloudState.CREATING,
    "READY": CloudState.RUNNING,
    "RESTARTING": CloudState.RUNNING,
    "REIMAGING": CloudState.RUNNING,
    "REPAIRING": CloudState.RUNNING,
    "STARTING": CloudState.RUNNING,
    "DELETING": CloudState.DELETING,
    "PREEMPTED": CloudState.PREEMPTED,
}
# GCE instance statuses; a stopped spot VM was preempted (Fray never stops VMs, it deletes them).
_GCE_STATES = {
    "PROVISIONING": CloudState.CREATING,
    "STAGING": CloudState.CREATING,
    "RUNNING": CloudState.RUNNING,
    "REPAIRING": CloudState.RUNNING,
    "DEPROVISIONING": CloudState.DELETING,
}
_STOPPED = {"STOPPING", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED"}


@dataclass
class _Pending:
    """A create whose operation had not finished when :meth:`GcpProvider.create_slice` returned."""

    request: SliceRequest
    operations: list[Any]
    created_at: float
    error: str = ""


class GcpProvider:
    """The ``gcp`` provider (see the module's docstring). Every method may be called from any thread.

    Google's calls are made outside the provider's lock (a create may wait ``create_wait``
    seconds for its operation); the lock only guards the provider's own records.
    """

    kind = "gcp"

    def __init__(
        self,
        settings: GcpSettings,
        *,
        cluster: str,
        controller: str,
        join_token: str,
        uses_tpu: bool,
        uses_gce: bool,
        tpu_client: Any = None,
        compute_client: Any = None,
        operations_client: Any = None,
    ) -> None:
        self.settings = settings
        self._cluster = cluster
        self._controller = controller
        self._token = join_token
        self._owned: list[Any] = []
        if uses_tpu and tpu_client is None:
            tpu_client = self._own(_default_tpu_client())
        if uses_gce and compute_client is None:
            compute_client = self._own(_default_compute_client())
        if uses_gce and operations_client is None:
            operations_client = self._own(_default_operations_client())
        # Only the APIs the cluster's groups use are called (a project may not have the other one enabled).
        self._tpu: Any = tpu_client if uses_tpu else None
        self._gce: Any = compute_client if uses_gce else None
        self._gce_ops: Any = operations_client if uses_gce else None
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        # GCE instances this provider asked to delete: a stopping spot VM being deleted is not preempted.
        self._deleting: set[str] = set()
        self._closed = threading.Event()

    def _own(self, client: Any) -> Any:
        self._owned.append(client)
        return client

    def rotate_join_token(self, join_token: str) -> None:
        """VMs created from now on join with ``join_token`` (the one before was revoked with a VM's worker)."""
        self._token = join_token

    # -- the Provider protocol ---------------------------------------------------------------

    def create_slice(self, request: SliceRequest) -> Sequence[ProviderVm]:
        """Create the slice's TPU node or GCE instances; idempotent by request id (and by slice id)."""
        is_tpu = tpu_type(request.resources) is not None
        operations = self._create_tpu(request) if is_tpu else self._create_gce(request)
        pending = _Pending(request, operations, time.time())
        error = self._wait(pending)
        if error is not None:
            self._delete(request.slice_id)  # no part of a refused slice may hold quota
            raise error
        if operations:
            with self._lock:
                self._pending[request.slice_id] = pending
        vms = self._describe(request.slice_id, is_tpu)
        return vms or [
            ProviderVm(vm_id, request.slice_id, request.group, i, CloudState.CREATING, pending.created_at)
            for i, vm_id in enumerate(request.vm_ids)
        ]

    def list_vms(self) -> Sequence[ProviderVm]:
        """This cluster's VMs (by the cluster label), plus FAILED ones for creates Google failed later."""
        vms: list[ProviderVm] = []
        if self._tpu is not None:
            nodes = self._call(self._tpu.list_nodes, "list TPU nodes", parent=self.settings.tpu_parent)
            vms += [vm for node in nodes for vm in self._node_vms(node)]
        if self._gce is not None:
            instances = self._gce_list(f'labels.{CLUSTER_LABEL} = "{self._cluster}"')
            with self._lock:
                self._deleting &= {inst.name for inst in instances}  # forget the ones that are gone
            vms += [vm for inst in instances if (vm := self._instance_vm(inst)) is not None]
        return vms + self._failed_creates({vm.slice_id for vm in vms})

    def delete_slice(self, slice_id: str) -> None:
        """Delete the slice's node or instances; a slice already gone (or going) is not an error."""
        with self._lock:
            self._pending.pop(slice_id, None)
        self._delete(slice_id)

    def close(self) -> None:
        """Close the clients this provider made (injected ones belong to the caller)."""
        self._closed.set()
        for client in self._owned:
            client.transport.close()
        self._owned.clear()

    # -- creating ----------------------------------------------------------------------------

    def _create_tpu(self, request: SliceRequest) -> list[Any]:
        from google.api_core import exceptions

        create = tpu_create_request(self.settings, self._cluster, self._controller, request, self._token)
        try:
            return [self._tpu.create_node(request=create)]
        except exceptions.Conflict:
            # The node exists: a repeated create (idempotent) if it is this slice of this cluster.
            name = f"{create.parent}/nodes/{request.slice_id}"
            node = self._call(self._tpu.get_node, f"get TPU node {request.slice_id}", name=name)
            self._check_ours(dict(node.labels), request, f"TPU node {request.slice_id}")
            return []
        except exceptions.GoogleAPICallError as exc:
            raise _translate(exc, f"create TPU node {request.slice_id}") from None

    def _create_gce(self, request: SliceRequest) -> list[Any]:
        from google.api_core import exceptions

        operations = []
        for insert in gce_insert_requests(self.settings, self._cluster, self._controller, request, self._token):
            name = insert.instance_resource.name
            try:
                operations.append(self._gce.insert_unary(request=insert))
            except exceptions.Conflict:
                # Inserted before under another requestId (a restart that lost nothing): ours if labelled so.
                instance = self._call(
                    self._gce.get, f"get GCE instance {name}", project=insert.project, zone=insert.zone, instance=name
                )
                self._check_ours(dict(instance.labels), request, f"GCE instance {name}")
            except exceptions.GoogleAPICallError as exc:
                self._delete(request.slice_id)  # the slice's instances inserted so far
                raise _translate(exc, f"create GCE instance {name}") from None
        return operations

    def _check_ours(self, labels: Mapping[str, str], request: SliceRequest, what: str) -> None:
        if labels.get(CLUSTER_LABEL) != self._cluster or labels.get(SLICE_LABEL) != request.slice_id:
            raise ProviderError(f"{what} already exists and is not slice {request.slice_id} of cluster {self._cluster}")

    def _wait(self, pending: _Pending) -> ProviderError | None:
        """Wait up to ``create_wait`` for the create's operations; the error a failed one reports."""
        deadline = time.monotonic() + self.settings.create_wait
        while True:
            error, done = self._poll(pending)
            if error is not None or done or time.monotonic() >= deadline or self._closed.is_set():
                return error
            self._closed.wait(_POLL_SECONDS)

    def _poll(self, pending: _Pending) -> tuple[ProviderError | None, bool]:
        """Refresh the create's operations: (the first failure, whether all are done)."""
        from google.api_core import exceptions

        all_done = True
        what = f"create {pending.request.slice_id}"
        for index, op in enumerate(pending.operations):
            try:
                if callable(getattr(op, "done", None)):  # a TPU long-running operation (a future)
                    if not op.done():
                        all_done = False
                    elif op.exception() is not None:
                        return _translate(op.exception(), what), True
                    continue
                if op.status.name != "DONE":  # a GCE zone operation: ask for it again
                    op = self._gce_ops.get(project=self.settings.project, zone=self.settings.zone, operation=op.name)
                    pending.operations[index] = op
                if op.status.name != "DONE":
                    all_done = False
                elif op.error.errors:
                    first = op.error.errors[0]
                    return _classify(f"{first.code} {first.message}", f"{what}: {first.message}"), True
            except exceptions.GoogleAPICallError as exc:
                return _translate(exc, f"poll the operation of {what}"), True
        return None, all_done

    # -- listing -----------------------------------------------------------------------------

    def _describe(self, slice_id: str, is_tpu: bool) -> list[ProviderVm]:
        """One slice's VMs as Google has them now (none if it is not there yet)."""
        from google.api_core import exceptions

        if not is_tpu:
            found = self._gce_list(f'labels.{SLICE_LABEL} = "{slice_id}"')
            return sorted((vm for i in found if (vm := self._instance_vm(i)) is not None), key=lambda v: v.host_index)
        try:
            return self._node_vms(self._tpu.get_node(name=f"{self.settings.tpu_parent}/nodes/{slice_id}"))
        except exceptions.NotFound:
            return []
        except exceptions.GoogleAPICallError as exc:
            raise _translate(exc, f"get TPU node {slice_id}") from None

    def _failed_creates(self, listed: set[str]) -> list[ProviderVm]:
        """FAILED VMs of creates Google accepted and failed later (a stock-out, say), until they are deleted."""
        with self._lock:
            pending = list(self._pending.items())
        out = []
        for slice_id, p in pending:
            if not p.error:
                error, done = self._poll(p)
                if error is not None:
                    p.error = str(error)
                elif done:
                    with self._lock:
                        self._pending.pop(slice_id, None)
                    continue
            if p.error and slice_id not in listed:
                out += [
                    ProviderVm(vm_id, slice_id, p.request.group, i, CloudState.FAILED, p.created_at, p.error)
                    for i, vm_id in enumerate(p.request.vm_ids)
                ]
        return out

    def _node_vms(self, node: Any) -> list[ProviderVm]:
        """A TPU node's hosts as VMs (none if the node is not this cluster's)."""
        labels = dict(node.labels)
        if labels.get(CLUSTER_LABEL) != self._cluster:
            return []
        slice_id = node.name.rsplit("/", 1)[-1]
        # The ids this provider wrote; Google lists a node's hosts (network endpoints) only once it is READY.
        vm_ids = [v for v in dict(node.metadata).get("fray-vm-ids", "").split(",") if v]
        if not vm_ids:
            vm_ids = list(vm_ids_of(slice_id, max(len(node.network_endpoints), 1)))
        state_name = node.state.name
        state = _TPU_STATES.get(state_name, CloudState.FAILED)
        reason = "" if state in (CloudState.CREATING, CloudState.RUNNING, CloudState.DELETING) else state_name.lower()
        created = node.create_time.timestamp() if node.create_time else time.time()
        group = labels.get(GROUP_LABEL, "")
        return [ProviderVm(vm_id, slice_id, group, i, state, created, reason) for i, vm_id in enumerate(vm_ids)]

    def _instance_vm(self, inst: Any) -> ProviderVm | None:
        """A GCE instance as a VM (None if it is not this cluster's)."""
        labels = dict(inst.labels)
        if labels.get(CLUSTER_LABEL) != self._cluster:
            return None
        spot = inst.scheduling.provisioning_model == "SPOT" or bool(inst.scheduling.preemptible)
        with self._lock:
            deleting = inst.name in self._deleting
        if deleting:
            state, reason = CloudState.DELETING, ""
        elif inst.status in _STOPPED:
            state = CloudState.PREEMPTED if spot else CloudState.FAILED
            reason = "preempted" if spot else f"stopped outside Fray ({inst.status.lower()})"
        else:
            state = _GCE_STATES.get(inst.status, CloudState.FAILED)
            reason = "" if inst.status in _GCE_STATES else f"status {inst.status}"
        host = int(labels.get("fray-host", "0") or 0)
        slice_id, group = labels.get(SLICE_LABEL, inst.name), labels.get(GROUP_LABEL, "")
        return ProviderVm(inst.name, slice_id, group, host, state, _timestamp(inst.creation_timestamp), reason)

    def _gce_list(self, label_filter: str) -> list[Any]:
        from google.cloud import compute_v1

        listing = compute_v1.ListInstancesRequest(
            project=self.settings.project, zone=self.settings.zone, filter=label_filter
        )
        return list(self._call(self._gce.list, "list GCE instances", request=listing))

    # -- deleting ----------------------------------------------------------------------------

    def _delete(self, slice_id: str) -> None:
        from google.api_core import exceptions

        if self._tpu is not None:
            name = f"{self.settings.tpu_parent}/nodes/{slice_id}"
            try:
                node = self._tpu.get_node(name=name)
                if dict(node.labels).get(CLUSTER_LABEL) == self._cluster and node.state.name != "DELETING":
                    self._tpu.delete_node(name=name)
            except (exceptions.NotFound, exceptions.FailedPrecondition):
                pass  # gone, or already being deleted
            except exceptions.GoogleAPICallError as exc:
                raise _translate(exc, f"delete TPU node {slice_id}") from None
        if self._gce is None:
            return
        for inst in self._gce_list(f'labels.{SLICE_LABEL} = "{slice_id}"'):
            with self._lock:
                asked = inst.name in self._deleting
            if dict(inst.labels).get(CLUSTER_LABEL) != self._cluster or asked:
                continue
            try:
                self._gce.delete_unary(project=self.settings.project, zone=self.settings.zone, instance=inst.name)
            except exceptions.NotFound:
                continue
            except exceptions.GoogleAPICallError as exc:
                # E.g. "resourceNotReady" while a preempted VM is still stopping: the autoscaler asks again later.
                raise _translate(exc, f"delete GCE instance {inst.name}") from None
            with self._lock:
                self._deleting.add(inst.name)

    def _call(self, method: Any, what: str, **kwargs: Any) -> Any:
        from google.api_core import exceptions

        try:
            result = method(**kwargs)
            return list(result) if hasattr(result, "pages") else result  # a pager: every page now
        except exceptions.GoogleAPICallError as exc:
            raise _translate(exc, what) from None


def _timestamp(text: str) -> float:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return time.time()


def _translate(exc: BaseException, what: str) -> ProviderError:
    """A Google API error as Fray's: quota, stock-out, not found, or a plain ProviderError."""
    from google.api_core import exceptions

    message = getattr(exc, "message", None) or str(exc)
    if isinstance(exc, exceptions.NotFound):
        return VmNotFound(f"{what}: {message}")
    detail = " ".join(
        str(x) for x in (message, getattr(exc, "details", None) or "", getattr(exc, "errors", None) or "")
    )
    exhausted = isinstance(exc, exceptions.ResourceExhausted | exceptions.TooManyRequests)
    return _classify(detail, f"{what}: {message}", exhausted=exhausted)


def _classify(detail: str, message: str, *, exhausted: bool = False) -> ProviderError:
    """Quota, stock-out or other, by Google's words: QuotaFailure/quotaExceeded/QUOTA_EXCEEDED mention quota."""
    text = detail.lower()
    if "quota" in text:
        return QuotaExceeded(message)
    stockout = ("resource_pool_exhausted", "no more capacity", "stockout", "not have enough resources")
    if exhausted or any(word in text for word in stockout):
        return CapacityUnavailable(message)
    return ProviderError(message)


def _default_tpu_client() -> Any:
    from google.cloud import tpu_v2

    return _with_credentials(lambda: tpu_v2.TpuClient(transport="rest"))


def _default_compute_client() -> Any:
    from google.cloud import compute_v1

    return _with_credentials(lambda: compute_v1.InstancesClient(transport="rest"))


def _default_operations_client() -> Any:
    from google.cloud import compute_v1

    return _with_credentials(lambda: compute_v1.ZoneOperationsClient(transport="rest"))


def _with_credentials(make: Any) -> Any:
    """A client with Application Default Credentials; ConfigError saying how to get some when there are none."""
    from google.auth import exceptions

    try:
        return make()
    except exceptions.DefaultCredentialsError as exc:
        raise ConfigError(
            f"the gcp provider found no Google credentials ({exc}); run `gcloud auth application-default login`, "
            "set GOOGLE_APPLICATION_CREDENTIALS to a service account key, or run the controller on a GCE VM"
        ) from None


def _kinds(config: ClusterConfig) -> tuple[bool, bool]:
    tpu = [tpu_type(g.resources) is not None for g in config.scale_groups]
    return any(tpu), not all(tpu)


def from_config(
    config: ClusterConfig,
    *,
    controller: str,
    join_token: str,
    tpu_client: Any = None,
    compute_client: Any = None,
    operations_client: Any = None,
) -> GcpProvider:
    """The provider of a ``kind: gcp`` cluster file.

    ``controller`` is the ``HOST:PORT`` VMs join; ``join_token`` the token their workers
    join with. The clients (a ``tpu_v2.TpuClient``, a ``compute_v1.InstancesClient`` and
    the ``compute_v1.ZoneOperationsClient`` that polls its operations) default to the
    REST clients with Application Default Credentials; tests pass clients pointed at a fake.
    """
    try:
        import google.cloud.compute_v1
        import google.cloud.tpu_v2  # noqa: F401
    except ImportError:
        raise ConfigError("provider kind gcp needs Google's client libraries: pip install 'fray[gcp]'") from None
    settings = GcpSettings.from_config(config)
    uses_tpu, uses_gce = _kinds(config)
    return GcpProvider(
        settings,
        cluster=config.name,
        controller=controller,
        join_token=join_token,
        uses_tpu=uses_tpu,
        uses_gce=uses_gce,
        tpu_client=tpu_client,
        compute_client=compute_client,
        operations_client=operations_client,
    )
