"""What workers offer and tasks need: devices, workers and task resources in plain numbers.

:func:`~fray.cluster.server.scheduler.schedule` fits :class:`TaskResources` onto
:class:`WorkerInfo`; the store keeps both; workers describe themselves with them.
Resource vectors have five dimensions (:data:`CPU`, :data:`RAM`, :data:`DISK`,
:data:`GPU`, :data:`TPU`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fray.errors import ConfigError
from fray.resources import TPU_TOPOLOGIES, CpuConfig, GpuConfig, ResourceConfig, TpuConfig, TpuTopology

__all__ = [
    "CPU",
    "DEVICE_KINDS",
    "DIM_NAMES",
    "DISK",
    "GPU",
    "RAM",
    "TPU",
    "Device",
    "TaskResources",
    "WorkerInfo",
    "format_amount",
    "format_bytes",
]

# Resource vectors are 5-tuples of ints indexed by these dimensions.
CPU, RAM, DISK, GPU, TPU = range(5)
DIM_NAMES = ("CPU", "RAM", "disk", "GPUs", "TPU chips")


def format_bytes(n: int) -> str:
    """``'1.5 GiB'``."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n} B"


def format_amount(dim: int, value: int) -> str:
    """An amount of dimension ``dim``: ``'2 cores'``, ``'64 GiB'``, ``'8'``."""
    if dim == CPU:
        cores = value / 1000
        return f"{cores:g} core{'s' if cores != 1 else ''}"
    if dim in (RAM, DISK):
        return format_bytes(value)
    return str(value)


DEVICE_KINDS = ("gpu", "tpu")
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})


@dataclass(frozen=True)
class Device:
    """``count`` accelerators of one ``kind`` (``"gpu"`` or ``"tpu"``) and ``type`` on a worker.

    For a TPU host, ``type`` is the slice type it belongs to (``"v5litepod-16"``) and
    ``count`` the chips on this host.
    """

    kind: str
    type: str
    count: int

    def __post_init__(self) -> None:
        if self.kind not in DEVICE_KINDS:
            raise ConfigError(f"Device(kind={self.kind!r}) must be one of {DEVICE_KINDS}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigError(f"Device(count={self.count!r}) must be a whole number >= 1")


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker offers: total capacity, accelerators and attributes.

    ``cpu_millis`` is in thousandths of a core. ``attributes`` carries placement
    facts as strings: ``preemptible`` (``"true"``/``"false"``; a worker without it
    counts as preemptible), ``region``, ``zone``, and for TPU hosts ``tpu-name`` (the
    slice) and ``tpu-worker-id`` (the host's index in the slice, from 0). A worker
    holds at most one device of each kind.
    """

    worker_id: str
    cpu_millis: int
    ram_bytes: int
    disk_bytes: int
    devices: tuple[Device, ...] = ()
    attributes: Mapping[str, str] = field(default_factory=dict, hash=False)
    alive: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        kinds = [d.kind for d in self.devices]
        if len(set(kinds)) != len(kinds):
            raise ConfigError(f"worker {self.worker_id!r} lists more than one device of a kind: {kinds}")
        for name in ("cpu_millis", "ram_bytes", "disk_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"WorkerInfo({name}={value!r}) must be a whole number >= 0")
        object.__setattr__(self, "attributes", {str(k): str(v) for k, v in self.attributes.items()})

    def device(self, kind: str) -> Device | None:
        """The worker's device of ``kind``, if any."""
        for dev in self.devices:
            if dev.kind == kind:
                return dev
        return None

    @property
    def preemptible(self) -> bool:
        """False only when the ``preemptible`` attribute says so explicitly."""
        return self.attributes.get("preemptible", "true").strip().lower() not in _FALSE_WORDS

    @property
    def region(self) -> str | None:
        """The ``region`` attribute."""
        return self.attributes.get("region")

    @property
    def zone(self) -> str | None:
        """The ``zone`` attribute."""
        return self.attributes.get("zone")

    @property
    def tpu_name(self) -> str | None:
        """The TPU slice this host belongs to (``tpu-name`` attribute)."""
        return self.attributes.get("tpu-name")

    @property
    def tpu_worker_id(self) -> int | None:
        """This host's index within its TPU slice (``tpu-worker-id``), or None if absent or malformed."""
        raw = self.attributes.get("tpu-worker-id")
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            return None


@dataclass(frozen=True)
class TaskResources:
    """What one task needs, in plain numbers (the normalized form of a :class:`ResourceConfig`).

    ``device_kind`` is ``"cpu"`` (no accelerator), ``"gpu"`` or ``"tpu"``; for a TPU
    ``device_type`` is the slice type and ``device_count`` the chips per host, because a
    TPU job runs one task on every host of its slice.
    """

    cpu_millis: int = 1000
    ram_bytes: int = 128 << 20
    disk_bytes: int = 1 << 30
    device_kind: str = "cpu"
    device_type: str = ""
    device_count: int = 0
    preemptible: bool = True
    regions: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.device_kind not in ("cpu", *DEVICE_KINDS):
            raise ConfigError(f"TaskResources(device_kind={self.device_kind!r}) must be cpu, gpu or tpu")
        if self.device_kind == "tpu" and self.device_type not in TPU_TOPOLOGIES:
            raise ConfigError(f"TaskResources(device_type={self.device_type!r}) is not a known TPU slice type")
        if self.regions is not None:
            object.__setattr__(self, "regions", tuple(self.regions))

    @classmethod
    def from_config(cls, config: ResourceConfig) -> TaskResources:
        """Normalize a :class:`ResourceConfig`."""
        device = config.device
        if isinstance(device, GpuConfig):
            kind, dtype, count = "gpu", device.type, device.count
        elif isinstance(device, TpuConfig):
            kind, dtype, count = "tpu", device.type, device.slice.chips_per_host
        else:
            assert isinstance(device, CpuConfig)
            kind, dtype, count = "cpu", "", 0
        return cls(
            cpu_millis=round(config.cpu * 1000),
            ram_bytes=config.ram_bytes,
            disk_bytes=config.disk_bytes,
            device_kind=kind,
            device_type=dtype,
            device_count=count,
            preemptible=config.preemptible,
            regions=config.placement_regions,
        )

    @property
    def tpu(self) -> TpuTopology | None:
        """The TPU slice shape each replica needs, or None for a non-TPU job."""
        return TPU_TOPOLOGIES[self.device_type] if self.device_kind == "tpu" else None

    @property
    def hosts_per_replica(self) -> int:
        """Tasks per replica: the slice's hosts for a TPU job, else 1."""
        topo = self.tpu
        return topo.hosts if topo is not None else 1

    def describe(self) -> str:
        """A short human rendering, e.g. ``"2 cores, 4 GiB RAM, 10 GiB disk, 8 H100 GPUs"``."""
        parts = [
            format_amount(0, self.cpu_millis),
            format_amount(1, self.ram_bytes) + " RAM",
            format_amount(2, self.disk_bytes) + " disk",
        ]
        if self.device_kind == "gpu":
            parts.append(f"{self.device_count} {self.device_type} GPU{'s' if self.device_count != 1 else ''}")
        elif self.device_kind == "tpu":
            parts.append(f"{self.device_count} {self.device_type} TPU chips")
        return ", ".join(parts)
