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
    script can install Fray) unless ``external_ip: false``.
``install``
    The shell command the start-up script runs when ``fray`` is not on the VM yet
    (default ``python3 -m pip install fray``).
``create_wait``
    Seconds a create waits for Google's operation, so that quota and stock-out errors that
    Google reports in the operation still reach the autoscaler as errors (default 10;
    0 returns at once). Errors reported later show in the listing as FAILED VMs.
``boot_timeout``
    Read by the autoscaler: seconds from create to the VM's worker joining (default 600).

A group whose device is ``tpu:TYPE:N`` becomes one TPU node per slice (node id = slice
id, ``acceleratorType`` = TYPE, its hosts are the slice's VMs; host ``i`` reads its index
from the TPU metadata ``agent-worker-number``). Other groups become one GCE instance per
VM (instance name = VM id), inserted with a ``requestId`` derived from the slice's
request id, so a repeated create makes no second instance. Every node and instance
carries the labels ``fray-cluster`` (the cluster's name), ``fray-group`` and
``fray-slice``: :meth:`GcpProvider.list_vms` lists only this cluster's VMs, and after a
controller restart it lists the ones to adopt.

Each VM's start-up script (metadata ``startup-script``) installs Fray if needed and
starts ``fray worker --controller HOST:PORT --join TOKEN --id VM_ID ...`` declaring the
group's resources and the attributes ``scale-group``, ``vm``, ``preemptible`` and, for
TPU nodes and multi-host slices, ``tpu-name`` and ``tpu-worker-id``. The join token is
passed in the VM's metadata (``fray-join-token``), not in the script's text.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from fray.autoscale.config import ClusterConfig, ScaleGroup
from fray.autoscale.provider import CLUSTER_LABEL, CloudState, ProviderVm, SliceRequest, VmResources
from fray.errors import CapacityUnavailable, ConfigError, ProviderError, QuotaExceeded, VmNotFound

__all__ = [
    "DEFAULT_BOOT_TIMEOUT",
    "GROUP_LABEL",
    "SLICE_LABEL",
    "GcpProvider",
    "GcpSettings",
    "from_config",
    "planned_calls",
    "startup_script",
]

#: The autoscaler's default ``provider.boot_timeout`` for a cloud (a TPU VM takes minutes; then Fray installs).
DEFAULT_BOOT_TIMEOUT = 600.0
DEFAULT_RUNTIME_VERSION = "tpu-ubuntu2204-base"
DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
DEFAULT_INSTALL = "python3 -m pip install fray"
DEFAULT_CREATE_WAIT = 10.0
GROUP_LABEL = "fray-group"
SLICE_LABEL = "fray-slice"
_TPU_HOST = "https://tpu.googleapis.com"
_COMPUTE_HOST = "https://compute.googleapis.com"
_KEYS = {
    "project",
    "zone",
    "runtime_version",
    "machine_type",
    "machine_types",
    "image",
    "network",
    "external_ip",
    "install",
    "create_wait",
    "boot_timeout",
}
# Google's resource names and label values: lower case, digits and '-', at most 63 characters.
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# Namespace of the GCE requestIds derived from Fray's request ids (GCE wants a UUID).
_REQUEST_NS = uuid.UUID("5d1f0a4e-2c1b-4f7e-9a57-6b0c1e9f3a20")
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


@dataclass(frozen=True)
class GcpSettings:
    """The ``provider:`` keys of a ``kind: gcp`` cluster file, checked."""

    project: str
    zone: str
    runtime_version: str = DEFAULT_RUNTIME_VERSION
    machine_type: str | None = None
    machine_types: Mapping[str, str] = field(default_factory=dict)
    image: str = DEFAULT_IMAGE
    network: str = "default"
    external_ip: bool = True
    install: str = DEFAULT_INSTALL
    create_wait: float = DEFAULT_CREATE_WAIT

    @classmethod
    def from_config(cls, config: ClusterConfig) -> GcpSettings:
        """Check the provider keys against the scale groups; ConfigError naming the key."""
        options = dict(config.provider.options)
        unknown = sorted(set(map(str, options)) - _KEYS)
        if unknown:
            raise ConfigError(
                f"provider.{unknown[0]} is not a gcp provider key; the keys are: {', '.join(sorted(_KEYS))}"
            )

        def text(key: str, default: str | None) -> str | None:
            value = options.get(key, default)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"provider.{key} must be a non-empty string, got {value!r}")
            return value

        project, zone = text("project", None), text("zone", None)
        if project is None or zone is None:
            missing = "project" if project is None else "zone"
            raise ConfigError(
                f"provider.{missing} is required for kind: gcp (e.g. project: my-project, zone: us-central2-b)"
            )
        types = options.get("machine_types", {})
        if not isinstance(types, dict) or not all(isinstance(v, str) and v for v in types.values()):
            raise ConfigError("provider.machine_types must map group names to machine types, e.g. {cpu: n2-standard-8}")
        for name in types:
            config.group(str(name))  # ConfigError naming the groups there are
        external_ip = options.get("external_ip", True)
        if not isinstance(external_ip, bool):
            raise ConfigError(f"provider.external_ip must be true or false, got {external_ip!r}")
        settings = cls(
            project=project,
            zone=zone,
            runtime_version=text("runtime_version", DEFAULT_RUNTIME_VERSION) or DEFAULT_RUNTIME_VERSION,
            machine_type=text("machine_type", None),
            machine_types={str(k): v for k, v in types.items()},
            image=text("image", DEFAULT_IMAGE) or DEFAULT_IMAGE,
            network=text("network", "default") or "default",
            external_ip=external_ip,
            install=text("install", DEFAULT_INSTALL) or DEFAULT_INSTALL,
            create_wait=config.provider.number("create_wait", DEFAULT_CREATE_WAIT),
        )
        config.provider.number("boot_timeout", DEFAULT_BOOT_TIMEOUT)
        for group in config.scale_groups:
            if _tpu_type(group.resources) is None and settings.machine_type_of(group.name) is None:
                raise ConfigError(
                    f"provider.machine_type (or provider.machine_types.{group.name}) is required: "
                    f"scale group {group.name!r} has no TPU, so it runs on GCE instances of a machine type"
                )
        return settings

    def machine_type_of(self, group: str) -> str | None:
        """The GCE machine type of a non-TPU group."""
        return self.machine_types.get(group, self.machine_type)

    @property
    def tpu_parent(self) -> str:
        """The TPU API's parent of this zone's nodes."""
        return f"projects/{self.project}/locations/{self.zone}"


def _tpu_type(resources: VmResources) -> str | None:
    for device in resources.devices:
        kind, _, rest = device.partition(":")
        if kind == "tpu":
            return rest.rsplit(":", 1)[0]
    return None


def _worker_attributes(request: SliceRequest, vm_id: str, host: str) -> dict[str, str]:
    attrs = {**dict(request.attributes), "scale-group": request.group, "vm": vm_id}
    attrs["preemptible"] = "true" if request.preemptible else "false"
    if _tpu_type(request.resources) is not None or len(request.vm_ids) > 1:
        attrs["tpu-name"] = request.slice_id
        attrs["tpu-worker-id"] = host
    return attrs


def startup_script(request: SliceRequest, *, controller: str, install: str = DEFAULT_INSTALL) -> str:
    """The start-up script every VM of the slice runs: install Fray if needed, start its worker.

    One script serves all hosts of a slice: a host finds its index in the metadata
    (``fray-host-index`` on GCE, ``agent-worker-number`` on TPU VMs) and its VM id in
    the slice's list. The join token is read from the metadata key ``fray-join-token``.
    """
    res = request.resources
    worker = ["fray", "worker", "--controller", controller, "--join", "@TOKEN@", "--id", "@VM@"]
    worker += ["--cpu", f"{res.cpu:g}", "--ram", str(res.ram_bytes), "--disk", str(res.disk_bytes)]
    for device in res.devices:
        worker += ["--device", device]
    for key, value in sorted(_worker_attributes(request, "@VM@", "@HOST@").items()):
        worker += ["--attr", f"{key}={value}"]
    command = " ".join(shlex.quote(part) for part in worker)
    # The placeholders become shell expansions after quoting, so that ids never need quoting twice.
    command = command.replace("@TOKEN@", '"$TOKEN"').replace("@VM@", '"$VM_ID"').replace("@HOST@", '"$HOST_INDEX"')
    vm_ids = " ".join(shlex.quote(v) for v in request.vm_ids)
    return "\n".join(
        [
            "#!/bin/bash",
            f"# Written by Fray's gcp provider: joins this VM to the Fray cluster at {controller}.",
            "set -euo pipefail",
            "attr() { curl -sf -H 'Metadata-Flavor: Google' "
            '"http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1"; }',
            f"VM_IDS=({vm_ids})",
            'HOST_INDEX="$(attr fray-host-index || attr agent-worker-number || echo 0)"',
            'VM_ID="${VM_IDS[$HOST_INDEX]}"',
            'TOKEN="$(attr fray-join-token)"',
            f"command -v fray >/dev/null || {install}",
            # A unit of its own: the worker outlives this script and is stopped with the VM.
            'systemd-run --unit=fray-worker --collect "$(command -v fray)" ' + command.removeprefix("fray "),
            "",
        ]
    )


def _labels(cluster: str, request: SliceRequest) -> dict[str, str]:
    labels = {CLUSTER_LABEL: cluster, GROUP_LABEL: request.group, SLICE_LABEL: request.slice_id}
    for key, value in labels.items():
        if not _NAME_RE.match(value):
            raise ProviderError(
                f"{key}={value!r} cannot be a GCP label or resource name: use lower case letters, digits and '-' "
                "(at most 63 characters, starting with a letter)"
            )
    return labels


def tpu_create_request(settings: GcpSettings, cluster: str, controller: str, request: SliceRequest, token: str) -> Any:
    """The ``CreateNodeRequest`` of a TPU slice (what :func:`planned_calls` prints, too)."""
    from google.cloud import tpu_v2

    accelerator = _tpu_type(request.resources)
    metadata = {
        "startup-script": startup_script(request, controller=controller, install=settings.install),
        "fray-join-token": token,
        "fray-vm-ids": ",".join(request.vm_ids),
    }
    node = tpu_v2.Node(
        accelerator_type=accelerator,
        runtime_version=settings.runtime_version,
        labels=_labels(cluster, request),
        metadata=metadata,
        network_config=tpu_v2.NetworkConfig(
            network=f"projects/{settings.project}/global/networks/{settings.network}",
            enable_external_ips=settings.external_ip,
        ),
        scheduling_config=tpu_v2.SchedulingConfig(spot=request.preemptible),
    )
    return tpu_v2.CreateNodeRequest(parent=settings.tpu_parent, node_id=request.slice_id, node=node)


def gce_insert_requests(
    settings: GcpSettings, cluster: str, controller: str, request: SliceRequest, token: str
) -> list[Any]:
    """One ``InsertInstanceRequest`` per VM of a non-TPU slice (what :func:`planned_calls` prints, too)."""
    from google.cloud import compute_v1

    machine_type = settings.machine_type_of(request.group)
    if machine_type is None:
        raise ConfigError(f"provider.machine_type is required for scale group {request.group!r}")
    script = startup_script(request, controller=controller, install=settings.install)
    if request.preemptible:
        scheduling = compute_v1.Scheduling(
            provisioning_model="SPOT",
            instance_termination_action="STOP",
            automatic_restart=False,
            on_host_maintenance="TERMINATE",
        )
    else:
        scheduling = compute_v1.Scheduling(provisioning_model="STANDARD")
    interface = compute_v1.NetworkInterface(network=f"global/networks/{settings.network}")
    if settings.external_ip:
        interface.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    out = []
    for host, vm_id in enumerate(request.vm_ids):
        if not _NAME_RE.match(vm_id):
            raise ProviderError(f"VM id {vm_id!r} cannot be a GCE instance name (lower case letters, digits and '-')")
        instance = compute_v1.Instance(
            name=vm_id,
            machine_type=f"zones/{settings.zone}/machineTypes/{machine_type}",
            labels={**_labels(cluster, request), "fray-host": str(host)},
            metadata=compute_v1.Metadata(
                items=[
                    compute_v1.Items(key="startup-script", value=script),
                    compute_v1.Items(key="fray-join-token", value=token),
                    compute_v1.Items(key="fray-host-index", value=str(host)),
                ]
            ),
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=settings.image,
                        disk_size_gb=max(10, math.ceil(request.resources.disk_bytes / 2**30)),
                    ),
                )
            ],
            network_interfaces=[interface],
            scheduling=scheduling,
        )
        request_id = str(uuid.uuid5(_REQUEST_NS, f"{cluster}/{request.request_id}/{vm_id}"))
        out.append(
            compute_v1.InsertInstanceRequest(
                project=settings.project, zone=settings.zone, instance_resource=instance, request_id=request_id
            )
        )
    return out


@dataclass
class _Pending:
    """A create whose operation had not finished when :meth:`GcpProvider.create_slice` returned."""

    request: SliceRequest
    operations: list[Any]
    created_at: float
    error: str = ""


class GcpProvider:
    """The ``gcp`` provider (see the module's docstring). Every method may be called from any thread."""

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
        self._tpu = tpu_client if tpu_client is not None or not uses_tpu else self._own(_default_tpu_client())
        if uses_gce and compute_client is None:
            compute_client = self._own(_default_compute_client())
        if uses_gce and operations_client is None:
            operations_client = self._own(_default_operations_client())
        self._gce, self._gce_ops = compute_client, operations_client
        self._lock = threading.RLock()
        self._pending: dict[str, _Pending] = {}
        # GCE instances this provider asked to delete: a stopping spot VM being deleted is not preempted.
        self._deleting: set[str] = set()
        self._closed = threading.Event()

    def _own(self, client: Any) -> Any:
        self._owned.append(client)
        return client

    # -- the Provider protocol ---------------------------------------------------------------

    def create_slice(self, request: SliceRequest) -> Sequence[ProviderVm]:
        """Create the slice's TPU node or GCE instances; idempotent by request id (and by slice id)."""
        with self._lock:
            if _tpu_type(request.resources) is not None:
                operations = self._create_tpu(request)
            else:
                operations = self._create_gce(request)
            pending = _Pending(request, operations, time.time())
            error = self._wait(pending)
            if error is not None:
                self._delete(request.slice_id)
                raise error
            if operations:
                self._pending[request.slice_id] = pending
            listed = [vm for vm in self._list() if vm.slice_id == request.slice_id]
            return listed or [
                ProviderVm(vm_id, request.slice_id, request.group, i, CloudState.CREATING, pending.created_at)
                for i, vm_id in enumerate(request.vm_ids)
            ]

    def list_vms(self) -> Sequence[ProviderVm]:
        """This cluster's VMs (by the cluster label), plus FAILED ones for creates Google failed later."""
        with self._lock:
            return self._list()

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
            node = self._call(
                self._tpu.get_node, f"get node {request.slice_id}", name=f"{create.parent}/nodes/{request.slice_id}"
            )
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
                instance = self._call(
                    self._gce.get, f"get instance {name}", project=insert.project, zone=insert.zone, instance=name
                )
                self._check_ours(dict(instance.labels), request, f"GCE instance {name}")
            except exceptions.GoogleAPICallError as exc:
                self._delete(request.slice_id)  # no part of a refused slice may hold quota
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
        for index, op in enumerate(pending.operations):
            what = f"create {pending.request.slice_id}"
            try:
                if hasattr(op, "done") and callable(op.done):  # a TPU long-running operation future
                    if not op.done():
                        all_done = False
                    elif op.exception() is not None:
                        return _translate(op.exception(), what), True
                    continue
                if op.status.name != "DONE":
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

    def _list(self) -> list[ProviderVm]:
        vms: list[ProviderVm] = []
        if self._tpu is not None:
            vms += self._list_tpu()
        if self._gce is not None:
            vms += self._list_gce()
        seen = {vm.slice_id for vm in vms}
        for slice_id, pending in list(self._pending.items()):
            if not pending.error:
                error, done = self._poll(pending)
                if error is not None:
                    pending.error = str(error)
                elif done:
                    del self._pending[slice_id]
                    continue
            if pending.error and slice_id not in seen:
                # Google failed the create after it was accepted (a stock-out, say): FAILED until deleted.
                for i, vm_id in enumerate(pending.request.vm_ids):
                    vms.append(
                        ProviderVm(
                            vm_id,
                            slice_id,
                            pending.request.group,
                            i,
                            CloudState.FAILED,
                            pending.created_at,
                            pending.error,
                        )
                    )
        return vms

    def _list_tpu(self) -> Iterator[ProviderVm]:
        nodes = self._call(self._tpu.list_nodes, "list TPU nodes", parent=self.settings.tpu_parent)
        for node in nodes:
            labels = dict(node.labels)
            if labels.get(CLUSTER_LABEL) != self._cluster:
                continue
            slice_id = node.name.rsplit("/", 1)[-1]
            hosts = max(len(node.network_endpoints), 1)
            vm_ids = [v for v in dict(node.metadata).get("fray-vm-ids", "").split(",") if v]
            if len(vm_ids) != hosts:
                vm_ids = list(_vm_ids(slice_id, hosts))
            state_name = node.state.name if hasattr(node.state, "name") else str(node.state)
            state = _TPU_STATES.get(state_name, CloudState.FAILED)
            reason = (
                "" if state in (CloudState.CREATING, CloudState.RUNNING, CloudState.DELETING) else state_name.lower()
            )
            created = node.create_time.timestamp() if node.create_time else time.time()
            group = labels.get(GROUP_LABEL, "")
            for i, vm_id in enumerate(vm_ids):
                yield ProviderVm(vm_id, slice_id, group, i, state, created, reason)

    def _list_gce(self) -> Iterator[ProviderVm]:
        from google.cloud import compute_v1

        listing = compute_v1.ListInstancesRequest(
            project=self.settings.project, zone=self.settings.zone, filter=f'labels.{CLUSTER_LABEL} = "{self._cluster}"'
        )
        instances = self._call(self._gce.list, "list GCE instances", request=listing)
        self._deleting &= {inst.name for inst in instances}  # forget the deleted ones
        for inst in instances:
            labels = dict(inst.labels)
            if labels.get(CLUSTER_LABEL) != self._cluster:
                continue
            spot = inst.scheduling.provisioning_model == "SPOT" or bool(inst.scheduling.preemptible)
            if inst.name in self._deleting:
                state, reason = CloudState.DELETING, ""
            elif inst.status in _STOPPED:
                state = CloudState.PREEMPTED if spot else CloudState.FAILED
                reason = "preempted" if spot else f"stopped outside Fray ({inst.status.lower()})"
            else:
                state = _GCE_STATES.get(inst.status, CloudState.FAILED)
                reason = "" if inst.status in _GCE_STATES else f"status {inst.status}"
            host = int(labels.get("fray-host", "0") or 0)
            created = _timestamp(inst.creation_timestamp)
            yield ProviderVm(
                inst.name, labels.get(SLICE_LABEL, inst.name), labels.get(GROUP_LABEL, ""), host, state, created, reason
            )

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
        if self._gce is not None:
            from google.cloud import compute_v1

            listing = compute_v1.ListInstancesRequest(
                project=self.settings.project, zone=self.settings.zone, filter=f'labels.{SLICE_LABEL} = "{slice_id}"'
            )
            for inst in self._call(self._gce.list, "list GCE instances", request=listing):
                if dict(inst.labels).get(CLUSTER_LABEL) != self._cluster or inst.name in self._deleting:
                    continue
                try:
                    self._gce.delete_unary(project=self.settings.project, zone=self.settings.zone, instance=inst.name)
                except exceptions.NotFound:
                    pass
                except exceptions.GoogleAPICallError as exc:
                    # "resourceNotReady": a delete is already in progress (asked before a restart, say).
                    if not (isinstance(exc, exceptions.BadRequest) and "not ready" in str(exc.message)):
                        raise _translate(exc, f"delete GCE instance {inst.name}") from None
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

    return tpu_v2.TpuClient(transport="rest")


def _default_compute_client() -> Any:
    from google.cloud import compute_v1

    return compute_v1.InstancesClient(transport="rest")


def _default_operations_client() -> Any:
    from google.cloud import compute_v1

    return compute_v1.ZoneOperationsClient(transport="rest")


def _kinds(config: ClusterConfig) -> tuple[bool, bool]:
    tpu = [_tpu_type(g.resources) is not None for g in config.scale_groups]
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


def planned_request(group: ScaleGroup, cluster: str, index: int) -> SliceRequest:
    """The request the autoscaler makes for a group's ``index``-th slice (its ids, attributes and request id)."""
    slice_id = f"{cluster}-{group.name}-{index}"
    attributes = {"scale-group": group.name}
    if group.is_slice:
        attributes["tpu-name"] = slice_id
    return SliceRequest(
        request_id=slice_id,
        group=group.name,
        slice_id=slice_id,
        vm_ids=_vm_ids(slice_id, group.hosts),
        resources=group.resources,
        attributes=attributes,
        preemptible=group.preemptible,
    )


def _vm_ids(slice_id: str, hosts: int) -> tuple[str, ...]:
    """The autoscaler's VM ids: the slice id for one host, ``SLICE-I`` for host I of several."""
    return (slice_id,) if hosts == 1 else tuple(f"{slice_id}-{i}" for i in range(hosts))


def planned_calls(config: ClusterConfig, *, controller: str) -> list[str]:
    """The calls ``fray cluster up --config`` would make at start-up: each group's ``min`` slices.

    One line per HTTP request, ``METHOD URL?QUERY BODY``, built by the same functions as the
    real requests and transcoded by the client libraries' own REST rules. The join token
    is shown as ``<join-token>``.
    """
    try:
        from google.api_core import path_template
        from google.cloud.compute_v1.services.instances.transports.rest_base import _BaseInstancesRestTransport
        from google.cloud.tpu_v2.services.tpu.transports.rest_base import _BaseTpuRestTransport
        from google.protobuf import json_format
    except ImportError:
        raise ConfigError("provider kind gcp needs Google's client libraries: pip install 'fray[gcp]'") from None
    settings = GcpSettings.from_config(config)
    lines = []
    for group in config.by_priority():
        for index in range(group.min):
            request = planned_request(group, config.name, index)
            if _tpu_type(group.resources) is not None:
                calls = [
                    (
                        _TPU_HOST,
                        _BaseTpuRestTransport._BaseCreateNode._get_http_options(),
                        tpu_create_request(settings, config.name, controller, request, "<join-token>"),
                    )
                ]
            else:
                options = _BaseInstancesRestTransport._BaseInsert._get_http_options()
                calls = [
                    (_COMPUTE_HOST, options, insert)
                    for insert in gce_insert_requests(settings, config.name, controller, request, "<join-token>")
                ]
            for host, options, message in calls:
                transcoded = path_template.transcode(options, message._pb)
                query = json.loads(json_format.MessageToJson(transcoded["query_params"]))
                body = json.loads(json_format.MessageToJson(transcoded["body"]))
                url = f"{host}{transcoded['uri']}" + (f"?{urlencode(query)}" if query else "")
                lines.append(
                    f"{transcoded['method'].upper()} {url} {json.dumps(body, sort_keys=True, separators=(',', ':'))}"
                )
    return lines
