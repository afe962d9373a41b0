"""The cluster file of ``fray cluster up --config cluster.yaml``: a provider and its scale groups.

Read with PyYAML and checked here, once: every mistake is a
:class:`~fray.errors.ConfigError` naming the file, the key and the fix. Defaults (see
``docs/autoscaling.md``): ``min: 0``, ``priority: 100``, ``hosts: 1``, ``disk: 100g``,
``preemptible: false``; for a slice group (``hosts`` > 1) ``min``/``max`` count slices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fray.cluster.server.autoscale.provider import VmResources
from fray.errors import ConfigError
from fray.resources import parse_size

__all__ = ["DEFAULT_IDLE_SECONDS", "DEFAULT_WORKER_TIMEOUT", "ClusterConfig", "ProviderConfig", "ScaleGroup"]

DEFAULT_WORKER_TIMEOUT = 10.0
DEFAULT_IDLE_SECONDS = 600.0
PROVIDER_KINDS = ("simulated", "gcp")
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
_GROUP_KEYS = {"resources", "hosts", "min", "max", "priority", "preemptible"}
_RESOURCE_KEYS = {"cpu", "ram", "disk", "device"}
_TOP_KEYS = {"provider", "worker_timeout", "idle_seconds", "scale_groups", "name"}


@dataclass(frozen=True)
class ProviderConfig:
    """``provider:``: its ``kind`` and the kind's own keys (``boot_seconds``, ``boot_timeout``, ``project`` ...)."""

    kind: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def number(self, key: str, default: float) -> float:
        """A positive number option, e.g. ``boot_timeout``; ConfigError if it is not one."""
        value = self.options.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConfigError(f"provider.{key} must be a number of seconds >= 0, got {value!r}")
        return float(value)


@dataclass(frozen=True)
class ScaleGroup:
    """One scale group: slices of ``hosts`` identical VMs, between ``min`` and ``max`` slices."""

    name: str
    resources: VmResources
    hosts: int = 1
    min: int = 0
    max: int = 0
    priority: int = 100
    preemptible: bool = False

    @property
    def is_slice(self) -> bool:
        """Whether the group's unit is a multi-host slice (created, placed and deleted as one)."""
        return self.hosts > 1


@dataclass(frozen=True)
class ClusterConfig:
    """A whole cluster file."""

    provider: ProviderConfig
    scale_groups: tuple[ScaleGroup, ...]
    worker_timeout: float = DEFAULT_WORKER_TIMEOUT
    idle_seconds: float = DEFAULT_IDLE_SECONDS
    name: str = "fray"
    """The cluster's name: the value of every VM's cluster label (two clusters in one project stay apart)."""

    def group(self, name: str) -> ScaleGroup:
        """The scale group called ``name``; ConfigError naming the groups there are."""
        for group in self.scale_groups:
            if group.name == name:
                return group
        names = ", ".join(g.name for g in self.scale_groups)
        raise ConfigError(f"no scale group {name!r} in this cluster; its groups are: {names}")

    def by_priority(self) -> tuple[ScaleGroup, ...]:
        """The groups in the order demand tries them: priority, then name."""
        return tuple(sorted(self.scale_groups, key=lambda g: (g.priority, g.name)))

    @classmethod
    def load(cls, path: str | Path) -> ClusterConfig:
        """Read and check a cluster file."""
        import yaml  # a core dependency, imported here so that ``import fray`` stays fast

        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read the cluster file {source}: {exc.strerror or exc}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source} is not valid YAML: {exc}") from None
        return cls.from_mapping(data, source=source)

    @classmethod
    def from_mapping(cls, data: object, *, source: str = "the cluster file") -> ClusterConfig:
        """Check an already parsed cluster file (``source`` names it in errors)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping with provider: and scale_groups:, got {data!r}")
        _no_unknown(data, _TOP_KEYS, source)
        provider = data.get("provider")
        if not isinstance(provider, dict) or provider.get("kind") not in PROVIDER_KINDS:
            raise ConfigError(
                f"{source}: provider.kind must be one of {', '.join(PROVIDER_KINDS)}, e.g. kind: simulated"
            )
        options = {k: v for k, v in provider.items() if k != "kind"}
        groups_data = data.get("scale_groups")
        if not isinstance(groups_data, dict) or not groups_data:
            raise ConfigError(f"{source}: scale_groups must map at least one group name to its settings")
        groups = tuple(_group(str(name), spec, source) for name, spec in groups_data.items())
        name = data.get("name", "fray")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ConfigError(
                f"{source}: name {name!r} must be lower case letters, digits and '-', starting with a letter"
            )
        return cls(
            provider=ProviderConfig(str(provider["kind"]), options),
            scale_groups=groups,
            worker_timeout=_seconds(data, "worker_timeout", DEFAULT_WORKER_TIMEOUT, source),
            idle_seconds=_seconds(data, "idle_seconds", DEFAULT_IDLE_SECONDS, source),
            name=name,
        )


def _group(name: str, spec: object, source: str) -> ScaleGroup:
    where = f"{source}: scale_groups.{name}"
    if not _NAME_RE.match(name):
        raise ConfigError(f"{where}: a group name is lower case letters, digits and '-', starting with a letter")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a mapping with resources: and max:")
    _no_unknown(spec, _GROUP_KEYS, where)
    res = spec.get("resources")
    if not isinstance(res, dict):
        raise ConfigError(f"{where}.resources must be a mapping such as {{cpu: 2, ram: 2g}}")
    _no_unknown(res, _RESOURCE_KEYS, f"{where}.resources")
    cpu = res.get("cpu")
    if isinstance(cpu, bool) or not isinstance(cpu, int | float) or cpu <= 0:
        raise ConfigError(f"{where}.resources.cpu must be a positive number of cores, got {cpu!r}")
    try:
        ram = parse_size(res.get("ram", "1g"), what=f"{where}.resources.ram")
        disk = parse_size(res.get("disk", "100g"), what=f"{where}.resources.disk")
    except ConfigError as exc:
        raise ConfigError(str(exc)) from None
    device = res.get("device")
    devices: tuple[str, ...] = ()
    if device is not None:
        parts = str(device).split(":")
        if len(parts) != 3 or parts[0] not in ("tpu", "gpu") or not parts[2].isdigit():
            raise ConfigError(f"{where}.resources.device {device!r} must be KIND:TYPE:COUNT, e.g. tpu:v4-16:4")
        devices = (str(device),)
    hosts = _int(spec, "hosts", 1, where, minimum=1)
    low = _int(spec, "min", 0, where, minimum=0)
    if "max" not in spec:
        raise ConfigError(f"{where}: max is required (the most {'slices' if hosts > 1 else 'VMs'} it may have)")
    high = _int(spec, "max", 0, where, minimum=1)
    if low > high:
        raise ConfigError(f"{where}: min {low} is above max {high}")
    preemptible = spec.get("preemptible", False)
    if not isinstance(preemptible, bool):
        raise ConfigError(f"{where}.preemptible must be true or false, got {preemptible!r}")
    return ScaleGroup(
        name=name,
        resources=VmResources(float(cpu), ram, disk, devices),
        hosts=hosts,
        min=low,
        max=high,
        priority=_int(spec, "priority", 100, where, minimum=0),
        preemptible=preemptible,
    )


def _int(spec: Mapping[str, Any], key: str, default: int, where: str, *, minimum: int) -> int:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}.{key} must be a whole number >= {minimum}, got {value!r}")
    return value


def _seconds(data: Mapping[str, Any], key: str, default: float, source: str) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{source}: {key} must be a positive number of seconds, got {value!r}")
    return float(value)


def _no_unknown(spec: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(map(str, spec)) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; the keys are: {', '.join(sorted(known))}")
