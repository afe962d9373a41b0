"""The requests the ``gcp`` provider sends, built once for the real calls and for ``planned_calls``.

The cluster file's ``provider:`` keys (checked into :class:`GcpSettings`), the start-up
script that joins a VM to the cluster, and the client libraries' request messages: a
TPU ``CreateNodeRequest`` per TPU slice, a GCE ``InsertInstanceRequest`` per VM of
other slices. :func:`planned_calls` transcodes the very same messages with the client
libraries' own REST rules, so ``fray cluster up --config … --dry-run`` cannot drift from
what :class:`fray.cluster.server.autoscale.gcp.GcpProvider` sends. See :mod:`fray.cluster.server.autoscale.gcp` for the keys.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from fray.cluster.server.autoscale.config import ClusterConfig, ScaleGroup
from fray.cluster.server.autoscale.provider import CLUSTER_LABEL, SliceRequest, VmResources
from fray.errors import ConfigError, ProviderError

__all__ = [
    "DEFAULT_BOOT_TIMEOUT",
    "GROUP_LABEL",
    "SLICE_LABEL",
    "GcpSettings",
    "gce_insert_requests",
    "planned_calls",
    "planned_request",
    "startup_script",
    "tpu_create_request",
    "tpu_type",
    "vm_ids_of",
]

#: The autoscaler's default ``provider.boot_timeout`` for a cloud (a TPU VM takes minutes; then Fray installs).
DEFAULT_BOOT_TIMEOUT = 600.0
DEFAULT_RUNTIME_VERSION = "tpu-ubuntu2204-base"
DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
# No default install command: Fray is not published under its name on PyPI, and installing whatever a
# package index calls "fray" onto every VM would run a stranger's code with the cluster's join token.
DEFAULT_INSTALL = ""
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
    # Read by fray.cluster.server.autoscale.providers.vm_controller_address: where the VMs reach the controller.
    "controller_address",
    # Read by the autoscaler (fray.cluster.server.autoscale.autoscaler.Policy), accepted here so that they are not unknown.
    "boot_timeout",
    "quota_block_seconds",
}
# Google's resource names and label values: lower case, digits and '-', at most 63 characters.
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# Namespace of the GCE requestIds derived from Fray's request ids (GCE wants a UUID).
_REQUEST_NS = uuid.UUID("5d1f0a4e-2c1b-4f7e-9a57-6b0c1e9f3a20")


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
            install=text("install", None) or DEFAULT_INSTALL,
            create_wait=config.provider.number("create_wait", DEFAULT_CREATE_WAIT),
        )
        config.provider.number("boot_timeout", DEFAULT_BOOT_TIMEOUT)
        config.provider.number("quota_block_seconds", 300.0)
        for group in config.scale_groups:
            _check_group(settings, config.name, group)
        return settings

    def machine_type_of(self, group: str) -> str | None:
        """The GCE machine type of a non-TPU group."""
        return self.machine_types.get(group, self.machine_type)

    @property
    def tpu_parent(self) -> str:
        """The TPU API's parent of this zone's nodes."""
        return f"projects/{self.project}/locations/{self.zone}"


def _check_group(settings: GcpSettings, cluster: str, group: ScaleGroup) -> None:
    """What GCP needs of a group: a machine type, ids that fit its names, the hosts its TPU type has."""
    accelerator = tpu_type(group.resources)
    if accelerator is None and settings.machine_type_of(group.name) is None:
        raise ConfigError(
            f"provider.machine_type (or provider.machine_types.{group.name}) is required: "
            f"scale group {group.name!r} has no TPU, so it runs on GCE instances of a machine type"
        )
    longest = vm_ids_of(f"{cluster}-{group.name}-{group.max * 100}", group.hosts)[-1]
    if not _NAME_RE.match(longest):
        raise ConfigError(
            f"scale group {group.name!r}: its VM ids (such as {longest}) are too long for GCP names and labels "
            "(at most 63 characters): shorten the group's name or the cluster's name"
        )
    hosts = _known_tpu_hosts(accelerator) if accelerator else None
    if hosts is not None and hosts != group.hosts:
        raise ConfigError(
            f"scale_groups.{group.name}.hosts is {group.hosts}, but a {accelerator} TPU slice has {hosts} "
            f"host(s): set hosts: {hosts}"
        )


def _known_tpu_hosts(accelerator: str) -> int | None:
    """Hosts of a TPU type whose shape is fixed (v2, v3, v4, v5p: 4 chips of 2 TensorCores per host); else None."""
    family, _, cores = accelerator.rpartition("-")
    if family not in ("v2", "v3", "v4", "v5p") or not cores.isdigit():
        return None
    return max(1, int(cores) // 8)


def tpu_type(resources: VmResources) -> str | None:
    """The TPU type of a group's ``tpu:TYPE:N`` device (``v4-16``), or None for a group without a TPU."""
    for device in resources.devices:
        kind, _, rest = device.partition(":")
        if kind == "tpu":
            return rest.rsplit(":", 1)[0]
    return None


def _worker_attributes(request: SliceRequest, vm_id: str, host: str) -> dict[str, str]:
    attrs = {**dict(request.attributes), "scale-group": request.group, "vm": vm_id}
    attrs["preemptible"] = "true" if request.preemptible else "false"
    if tpu_type(request.resources) is not None or len(request.vm_ids) > 1:
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
            f"command -v fray >/dev/null || {install}" if install else "true  # provider.install is not set",
            "command -v fray >/dev/null || { echo 'fray is not on this VM: set provider.install' >&2; exit 1; }",
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

    accelerator = tpu_type(request.resources)
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
        vm_ids=vm_ids_of(slice_id, group.hosts),
        resources=group.resources,
        attributes=attributes,
        preemptible=group.preemptible,
    )


def vm_ids_of(slice_id: str, hosts: int) -> tuple[str, ...]:
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
    except ImportError as exc:
        raise ImportError(
            f"provider kind gcp needs Google's client libraries (pip install 'fray[gcp]'): {exc}"
        ) from None
    settings = GcpSettings.from_config(config)
    lines = []
    for group in config.by_priority():
        for index in range(group.min):
            request = planned_request(group, config.name, index)
            if tpu_type(group.resources) is not None:
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
