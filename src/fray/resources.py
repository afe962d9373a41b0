"""What one task or actor needs: cpu, memory, disk, an accelerator, placement constraints.

All types here are frozen dataclasses validated at construction, so a typo such as
``ram="4gg"`` fails where it was written, with a message saying what is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from fray.core._sizes import check_size, format_size, parse_size, scaled_size
from fray.errors import ConfigError

__all__ = [
    "ANY_REGION",
    "GPU_TYPES",
    "TPU_HBM_BYTES_PER_CHIP",
    "TPU_TOPOLOGIES",
    "CpuConfig",
    "DeviceConfig",
    "GpuConfig",
    "ResourceConfig",
    "TpuConfig",
    "TpuTopology",
    "device_name",
    "format_size",
    "get_tpu_topology",
    "parse_device_name",
    "parse_size",
    "tpu_family",
    "tpu_hbm_bytes_per_chip",
    "tpu_hbm_capacity_bytes",
]


def _one_spelling(what: str, type: str | None, variant: str | None, default: str | None) -> str:
    """``type`` or marin's ``variant`` (one of them, or both the same); ``default`` when neither is given."""
    if type is not None and variant is not None and type != variant:
        raise ConfigError(f"{what}(type={type!r}, variant={variant!r}): give one of them (variant is marin's name)")
    chosen = type if type is not None else variant if variant is not None else default
    if chosen is None:
        raise ConfigError(f"{what} needs a type, e.g. {what}('v5litepod-16')")
    return chosen


@dataclass(frozen=True)
class CpuConfig:
    """No accelerator: the task runs on CPUs only."""

    kind: str = field(default="cpu", init=False)

    @property
    def variant(self) -> str:
        """Always ``"cpu"`` (marin's field of the same name)."""
        return "cpu"

    def chip_count(self) -> int:
        """No accelerator chips: 0."""
        return 0

    def device_flops(self, dtype: str = "bf16") -> float:
        """0.0: Fray does not rate CPUs."""
        return 0.0

    def total_flops(self, dtype: str = "bf16") -> float:
        """0.0: Fray does not rate CPUs."""
        return 0.0


# Accelerator types Fray knows how to map onto each engine. Typos are the common
# failure, so unknown names are rejected rather than passed through.
GPU_TYPES: tuple[str, ...] = (
    "auto",
    "A10",
    "A10G",
    "A100",
    "A100-40G",
    "A100-80G",
    "B100",
    "B200",
    "H100",
    "H200",
    "L4",
    "L40S",
    "T4",
    "V100",
)


@dataclass(frozen=True, init=False)
class GpuConfig:
    """``count`` GPUs of ``type`` per task (``"auto"``: any GPU type).

    ``variant`` is marin's spelling of ``type`` (``GpuConfig(variant="H100", count=8)``):
    accepted as a keyword and readable as a property; ``type`` is canonical.
    """

    type: str = "auto"
    count: int = 1
    kind: str = field(default="gpu", init=False)

    def __init__(self, type: str | None = None, count: int = 1, *, variant: str | None = None) -> None:
        object.__setattr__(self, "type", _one_spelling("GpuConfig", type, variant, "auto"))
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "kind", "gpu")
        self.__post_init__()

    @property
    def variant(self) -> str:
        """marin's name for :attr:`type`."""
        return self.type

    def chip_count(self) -> int:
        """GPUs per task (marin's name; :attr:`count` is Fray's)."""
        return self.count

    def device_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s of one GPU for ``dtype`` (see :mod:`fray.device_flops`); 0.0 when unknown."""
        from fray.device_flops import device_flops

        return device_flops(self.type, dtype) or 0.0

    def total_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s of all :attr:`count` GPUs."""
        return self.device_flops(dtype) * self.count

    def __post_init__(self) -> None:
        if self.type not in GPU_TYPES:
            close = [t for t in GPU_TYPES if t.lower() == str(self.type).lower()]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"GpuConfig(type={self.type!r}) is not a known GPU type{hint}; known: {', '.join(GPU_TYPES)}"
            )
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigError(f"GpuConfig(count={self.count!r}) must be a whole number >= 1")


@dataclass(frozen=True)
class TpuTopology:
    """One TPU slice shape: how many chips, over how many hosts."""

    name: str
    family: str
    chips: int
    hosts: int
    chips_per_host: int
    topology: str

    # marin's names for the same facts (its ``TpuTopologyInfo``); a TPU VM is one host.
    @property
    def chip_count(self) -> int:
        """marin's name for :attr:`chips`."""
        return self.chips

    @property
    def host_count(self) -> int:
        """marin's name for :attr:`hosts`."""
        return self.hosts

    @property
    def vm_count(self) -> int:
        """Hosts (TPU VMs) in the slice: :attr:`hosts`."""
        return self.hosts

    @property
    def chips_per_vm(self) -> int:
        """marin's name for :attr:`chips_per_host`."""
        return self.chips_per_host


def _tpu_table() -> dict[str, TpuTopology]:
    rows: list[TpuTopology] = []
    # v4 and v5p: the name counts TensorCores (2 per chip), 4 chips per host, 3D torus.
    cube = ["2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"]
    for family, prefix in (("v4", "v4"), ("v5p", "v5p")):
        for topo in cube:
            chips = math.prod(int(d) for d in topo.split("x"))
            rows.append(TpuTopology(f"{prefix}-{chips * 2}", family, chips, max(1, chips // 4), min(chips, 4), topo))
    # v5e and v6e: the name counts chips; single-host slices hold up to 8 chips,
    # multi-host slices put 4 chips on each host, 2D torus.
    flat = [(1, "1x1"), (4, "2x2"), (8, "2x4"), (16, "4x4"), (32, "4x8"), (64, "8x8"), (128, "8x16"), (256, "16x16")]
    for family, prefix in (("v5e", "v5litepod"), ("v6e", "v6e")):
        for chips, topo in flat:
            hosts = 1 if chips <= 8 else chips // 4
            rows.append(TpuTopology(f"{prefix}-{chips}", family, chips, hosts, chips // hosts, topo))
    return {row.name: row for row in rows}


TPU_TOPOLOGIES: dict[str, TpuTopology] = _tpu_table()
"""Known TPU slice types (``"v4-8"``, ``"v5litepod-16"``, ``"v5p-64"``, ``"v6e-256"``, ...)."""

TPU_HBM_BYTES_PER_CHIP: dict[str, int] = {"v4": 32 << 30, "v5e": 16 << 30, "v5p": 95 << 30, "v6e": 32 << 30}
"""High-bandwidth memory of one chip of each TPU family, in bytes (the vendor's published sizes)."""


def get_tpu_topology(tpu_type: str) -> TpuTopology:
    """The shape of the TPU slice type ``tpu_type``; ConfigError for an unknown type."""
    return TpuConfig(tpu_type).slice


def tpu_family(tpu_type: str) -> str:
    """The family of a TPU slice type: ``"v4"``, ``"v5e"``, ``"v5p"`` or ``"v6e"``."""
    return get_tpu_topology(tpu_type).family


def tpu_hbm_bytes_per_chip(family: str) -> int:
    """HBM of one chip of a TPU ``family`` in bytes; ConfigError for an unknown family."""
    if family not in TPU_HBM_BYTES_PER_CHIP:
        raise ConfigError(f"unknown TPU family {family!r}; known: {', '.join(TPU_HBM_BYTES_PER_CHIP)}")
    return TPU_HBM_BYTES_PER_CHIP[family]


def tpu_hbm_capacity_bytes(tpu_type: str) -> int:
    """HBM of a whole TPU slice of ``tpu_type`` in bytes (all its chips)."""
    topology = get_tpu_topology(tpu_type)
    return topology.chips * tpu_hbm_bytes_per_chip(topology.family)


@dataclass(frozen=True, init=False)
class TpuConfig:
    """One TPU slice of ``type`` (e.g. ``"v5litepod-16"``); ``topology`` may be given to double-check.

    ``variant`` is marin's spelling of ``type`` (``TpuConfig(variant="v5p-8")``): accepted
    as a keyword and readable as a property; ``type`` is canonical.
    """

    type: str
    topology: str | None = None
    kind: str = field(default="tpu", init=False)

    def __init__(self, type: str | None = None, topology: str | None = None, *, variant: str | None = None) -> None:
        object.__setattr__(self, "type", _one_spelling("TpuConfig", type, variant, None))
        object.__setattr__(self, "topology", topology)
        object.__setattr__(self, "kind", "tpu")
        self.__post_init__()

    @property
    def variant(self) -> str:
        """marin's name for :attr:`type`."""
        return self.type

    def chip_count(self) -> int:
        """Chips in the slice (all its hosts)."""
        return self.slice.chips

    def vm_count(self) -> int:
        """Hosts (TPU VMs) in the slice."""
        return self.slice.hosts

    def device_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s of one chip for ``dtype`` (see :mod:`fray.device_flops`); 0.0 when unknown."""
        from fray.device_flops import device_flops

        return device_flops(self.type, dtype) or 0.0

    def total_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s of the whole slice."""
        return self.device_flops(dtype) * self.chip_count()

    def __post_init__(self) -> None:
        if not isinstance(self.type, str):
            raise ConfigError(f"TpuConfig(type={self.type!r}) must be a TPU slice type such as 'v5litepod-16'")
        info = TPU_TOPOLOGIES.get(self.type)
        if info is None:
            families = sorted({t.family for t in TPU_TOPOLOGIES.values()})
            examples = ", ".join(n for n in TPU_TOPOLOGIES if n.endswith(("-8", "-16")))
            raise ConfigError(
                f"TpuConfig(type={self.type!r}) is not a known TPU slice type; families {families}, "
                f"e.g. {examples} (see fray.TPU_TOPOLOGIES for all)"
            )
        if self.topology is not None and self.topology != info.topology:
            raise ConfigError(
                f"TpuConfig(type={self.type!r}, topology={self.topology!r}): a {self.type} slice has "
                f"topology {info.topology!r}; omit topology or give that one"
            )

    @property
    def slice(self) -> TpuTopology:
        """The slice's shape: chips, hosts and chips per host."""
        return TPU_TOPOLOGIES[self.type]


DeviceConfig = CpuConfig | GpuConfig | TpuConfig

ANY_REGION = "*"
"""``regions=[ANY_REGION]`` is the same as ``regions=None``: anywhere (marin's spelling)."""

_REGION_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def device_name(device: DeviceConfig) -> str:
    """One device as a short string: ``"cpu"``, ``"gpu:H100:8"``, ``"tpu:v5litepod-16"`` (see :func:`parse_device_name`)."""
    if isinstance(device, GpuConfig):
        return f"gpu:{device.type}:{device.count}"
    if isinstance(device, TpuConfig):
        return f"tpu:{device.type}"
    return "cpu"


def parse_device_name(text: str) -> DeviceConfig:
    """The device :func:`device_name` wrote; ConfigError for anything else."""
    kind, _, rest = text.partition(":")
    if kind == "cpu" and not rest:
        return CpuConfig()
    if kind == "tpu" and rest:
        return TpuConfig(rest)
    if kind == "gpu" and rest:
        gpu_type, _, count = rest.partition(":")
        if count.isdigit():
            return GpuConfig(gpu_type, int(count))
    raise ConfigError(f"{text!r} is not a device name such as 'cpu', 'gpu:H100:8' or 'tpu:v5litepod-16'")


def _device_from_name(text: str) -> DeviceConfig:
    """A device by name: ``"tpu:v6e-16"``/``"gpu:H100:8"`` (:func:`device_name`), or a bare TPU or GPU type."""
    if ":" in text or text == "cpu":
        return parse_device_name(text)
    if text in TPU_TOPOLOGIES:
        return TpuConfig(text)
    if text in GPU_TYPES:
        return GpuConfig(text)
    raise ConfigError(
        f"device {text!r} is neither a TPU slice type (e.g. 'v6e-16'), a GPU type (e.g. 'H100') nor a device "
        "name such as 'gpu:H100:8'"
    )


@dataclass(frozen=True)
class ResourceConfig:
    """What one replica of a job (or one actor) needs.

    ``cpu`` is a number of cores (fractions allowed), ``ram`` and ``disk`` are size
    strings with a unit, such as ``"512m"``, ``"4g"`` or ``"4GiB"`` (powers of 1024;
    ``"512b"`` for bytes), ``device`` an accelerator, ``preemptible=False`` asks for a
    host that is never preempted, ``regions`` and ``zone`` restrict placement (a zone
    such as ``"us-central1-a"`` must lie in one of ``regions`` when both are given).

    ``device_alternatives`` lists accelerators that would all do, most wanted first
    (seed 001's "v5e or v6e or v5p"): the work is placed on any one of them, and
    ``current_job().device`` says which it got. ``device`` is then the first of them.

    A bare number (``ram=4`` or ``ram="4"``) is refused with :class:`~fray.errors.ConfigError`:
    it is ambiguous (4 bytes? 4 GiB?), and a typo there would place a job on the wrong
    host or nowhere. Code that holds a byte count writes ``ram=f"{n}b"``.

    Fields and methods of marin's ``fray.types.ResourceConfig`` (see ``docs/marin.md``):
    ``replicas`` is the replica count a job takes when its :class:`~fray.job.JobRequest`
    gives none (``with_tpu(..., slice_count=4)``); ``image`` runs a job in that container
    image (as ``EnvironmentConfig.docker_image``); ``target_cluster`` and
    ``container_profile`` are Iris settings that Fray's backends refuse when set.
    ``device_alternatives`` may also be given as names (``["v6e-16"]``, ``"gpu:H100:8"``):
    then, as in marin, they are the alternatives *besides* ``device``.
    """

    cpu: float = 1
    ram: str = "128m"
    disk: str = "1g"
    device: DeviceConfig = field(default_factory=CpuConfig)
    preemptible: bool = True
    regions: Sequence[str] | None = None
    zone: str | None = None
    device_alternatives: Sequence[DeviceConfig] | None = None
    replicas: int = 1
    image: str | None = None
    target_cluster: str | None = None
    container_profile: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.cpu, bool) or not isinstance(self.cpu, int | float) or not math.isfinite(self.cpu):
            raise ConfigError(f"ResourceConfig(cpu={self.cpu!r}) must be a number of cores, e.g. 1 or 0.5")
        if self.cpu < 0:
            raise ConfigError(f"ResourceConfig(cpu={self.cpu!r}) must not be negative")
        check_size("ram", self.ram)
        check_size("disk", self.disk)
        if not isinstance(self.device, CpuConfig | GpuConfig | TpuConfig):
            raise ConfigError(
                f"ResourceConfig(device={self.device!r}) must be CpuConfig(), GpuConfig(type, count) or TpuConfig(type)"
            )
        if not isinstance(self.preemptible, bool):
            raise ConfigError(f"ResourceConfig(preemptible={self.preemptible!r}) must be True or False")
        if self.regions is not None and not isinstance(self.regions, str) and list(self.regions) == [ANY_REGION]:
            object.__setattr__(self, "regions", None)  # marin's "anywhere"
        if self.regions is not None:
            if isinstance(self.regions, str):
                raise ConfigError(
                    f"ResourceConfig(regions={self.regions!r}) must be a list of regions, e.g. [{self.regions!r}]"
                )
            regions = tuple(self.regions)
            bad = [r for r in regions if not isinstance(r, str) or not _REGION_RE.match(r)]
            if bad or not regions:
                raise ConfigError(
                    f"ResourceConfig(regions={self.regions!r}): give a non-empty list of region names "
                    "such as ['us-central1'], or None for anywhere"
                )
            object.__setattr__(self, "regions", regions)
        if self.zone is not None:
            if not isinstance(self.zone, str) or not _REGION_RE.match(self.zone):
                raise ConfigError(f"ResourceConfig(zone={self.zone!r}) must be a zone name such as 'us-central1-a'")
            if self.regions is not None and not any(self.zone.startswith(f"{r}-") for r in self.regions):
                raise ConfigError(
                    f"ResourceConfig(zone={self.zone!r}, regions={list(self.regions)!r}): the zone is in none of "
                    "the regions; drop one of them or make them agree"
                )
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise ConfigError(f"ResourceConfig(replicas={self.replicas!r}) must be a whole number >= 1")
        for name in ("image", "target_cluster", "container_profile"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"ResourceConfig({name}={value!r}) must be a non-empty string or None")
        if self.device_alternatives is not None:
            self._named_alternatives()
            self._check_alternatives()

    def _named_alternatives(self) -> None:
        """marin's form: alternatives given by name, besides ``device`` (which comes first when it is not a CPU)."""
        given = self.device_alternatives
        if isinstance(given, str) or not isinstance(given, Sequence):
            return  # _check_alternatives explains what is wanted
        if not any(isinstance(d, str) for d in given):
            return
        choices = [_device_from_name(d) if isinstance(d, str) else d for d in given]
        if not isinstance(self.device, CpuConfig) and self.device not in choices:
            choices.insert(0, self.device)
        elif not isinstance(self.device, CpuConfig):
            choices.remove(self.device)
            choices.insert(0, self.device)
        object.__setattr__(self, "device_alternatives", tuple(choices))

    def _check_alternatives(self) -> None:
        given = self.device_alternatives
        if isinstance(given, CpuConfig | GpuConfig | TpuConfig | str) or given is None:
            raise ConfigError(
                f"ResourceConfig(device_alternatives={given!r}) must be a list of devices, e.g. "
                "[TpuConfig('v5litepod-16'), TpuConfig('v6e-16')]"
            )
        choices = tuple(given)
        bad = [d for d in choices if not isinstance(d, CpuConfig | GpuConfig | TpuConfig)]
        if bad or not choices:
            raise ConfigError(
                f"ResourceConfig(device_alternatives={given!r}): give a non-empty list of CpuConfig, GpuConfig or "
                "TpuConfig values"
            )
        if len(set(choices)) != len(choices):
            raise ConfigError(f"ResourceConfig(device_alternatives={given!r}) names a device twice")
        if not isinstance(self.device, CpuConfig) and self.device != choices[0]:
            raise ConfigError(
                f"ResourceConfig(device={self.device!r}, device_alternatives=...): give the devices in "
                "device_alternatives only (the first is the one most wanted)"
            )
        object.__setattr__(self, "device_alternatives", choices)
        object.__setattr__(self, "device", choices[0])

    # ----- marin's builders and measures (fray.types.ResourceConfig) -------------------------

    @staticmethod
    def with_cpu(**kwargs: object) -> ResourceConfig:
        """A CPU-only request; ``kwargs`` are any other fields (``cpu=4, ram="16g"``)."""
        return ResourceConfig(**kwargs)  # type: ignore[arg-type]

    @staticmethod
    def with_gpu(gpu_type: str = "auto", count: int = 1, **kwargs: object) -> ResourceConfig:
        """``count`` GPUs of ``gpu_type`` per replica; ``kwargs`` are any other fields."""
        return ResourceConfig(device=GpuConfig(gpu_type, count), **kwargs)  # type: ignore[arg-type]

    @staticmethod
    def with_tpu(tpu_type: str | Sequence[str], *, slice_count: int = 1, **kwargs: object) -> ResourceConfig:
        """One TPU slice of ``tpu_type`` per replica, ``slice_count`` replicas (slices).

        A list of types is a choice, the first most wanted (``device_alternatives``).
        cpu and ram keep Fray's defaults unless given: Fray does not size them from the
        TPU host (marin reserves half of it).
        """
        names = [tpu_type] if isinstance(tpu_type, str) else list(tpu_type)
        if not names:
            raise ConfigError("ResourceConfig.with_tpu needs a TPU type, e.g. 'v5litepod-16'")
        devices = [TpuConfig(name) for name in names]
        shapes = {(d.slice.hosts, d.slice.chips_per_host) for d in devices}
        if len(shapes) > 1:
            raise ConfigError(
                f"ResourceConfig.with_tpu({names!r}): alternatives must have the same hosts and chips per host"
            )
        alternatives = devices if len(devices) > 1 else None
        return ResourceConfig(
            device=devices[0],
            device_alternatives=alternatives,
            replicas=slice_count,
            **kwargs,  # type: ignore[arg-type]
        )

    def scale(
        self,
        factor: float | None = None,
        /,
        *,
        cpu: float | None = None,
        ram: float | None = None,
        disk: float | None = None,
    ) -> ResourceConfig:
        """A copy with cpu, ram and disk multiplied: all by ``factor``, or each by its own keyword."""
        if factor is not None and (cpu, ram, disk) != (None, None, None):
            raise ConfigError("ResourceConfig.scale: give one factor for all, or cpu=/ram=/disk= factors, not both")
        if factor is not None:
            cpu = ram = disk = factor
        for name, value in (("factor", factor), ("cpu", cpu), ("ram", ram), ("disk", disk)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
                raise ConfigError(f"ResourceConfig.scale({name}={value!r}) must be a number >= 0")
        return replace(
            self,
            cpu=self.cpu if cpu is None else self.cpu * cpu,
            ram=self.ram if ram is None else scaled_size(self.ram_bytes, ram),
            disk=self.disk if disk is None else scaled_size(self.disk_bytes, disk),
        )

    def chip_count(self) -> int:
        """Accelerator chips over all :attr:`replicas`: GPUs, or each TPU slice's chips; 0 for CPU."""
        return self.device.chip_count() * self.replicas

    def device_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s of one chip of :attr:`device` (0.0 for CPU or an unrated device)."""
        return self.device.device_flops(dtype)

    def total_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s of all chips over all replicas."""
        return self.device_flops(dtype) * self.chip_count()

    @property
    def device_choices(self) -> tuple[DeviceConfig, ...]:
        """The devices the work may run on, most wanted first (just ``device`` without alternatives)."""
        return tuple(self.device_alternatives) if self.device_alternatives else (self.device,)

    def with_device(self, device: DeviceConfig) -> ResourceConfig:
        """The same request for exactly ``device`` (what a backend places once it chose an alternative)."""
        return replace(self, device=device, device_alternatives=None)

    @classmethod
    def placement_only(cls, *, preemptible: bool = True, regions: Sequence[str] | None = None) -> ResourceConfig:
        """Reserve nothing (no cpu, memory or disk), only constrain where the work runs.

        What an actor created without ``resources=`` gets; pass it explicitly to keep
        an actor, say, on a non-preemptible host: ``placement_only(preemptible=False)``.
        """
        return cls(cpu=0, ram="0b", disk="0b", preemptible=preemptible, regions=regions)

    @property
    def reserves_nothing(self) -> bool:
        """True when no cpu, memory, disk or accelerator is reserved (only placement constraints apply)."""
        return self.cpu == 0 and self.ram_bytes == 0 and self.disk_bytes == 0 and isinstance(self.device, CpuConfig)

    @property
    def ram_bytes(self) -> int:
        """``ram`` in bytes."""
        return parse_size(self.ram)

    @property
    def disk_bytes(self) -> int:
        """``disk`` in bytes."""
        return parse_size(self.disk)

    @property
    def device_count(self) -> int:
        """Accelerators per replica: GPUs, TPU chips per host, or 0 for CPU-only."""
        if isinstance(self.device, GpuConfig):
            return self.device.count
        if isinstance(self.device, TpuConfig):
            return self.device.slice.chips_per_host
        return 0
