"""What one task or actor needs: cpu, memory, disk, an accelerator, placement constraints.

All types here are frozen dataclasses validated at construction, so a typo such as
``ram="4gg"`` fails where it was written, with a message saying what is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from fray.core._sizes import check_size, format_size, parse_size, scaled_size
from fray.errors import ConfigError

__all__ = [
    "ANY_REGION",
    "DEFAULT_TPU_HOST_FRACTION",
    "GPU_TYPES",
    "TPU_HBM_BYTES_PER_CHIP",
    "TPU_HOST_RESOURCES",
    "TPU_TOPOLOGIES",
    "CpuConfig",
    "DeviceConfig",
    "DeviceNames",
    "GpuConfig",
    "ResourceConfig",
    "TpuConfig",
    "TpuFamily",
    "TpuHostResources",
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
    """No accelerator: the task runs on CPUs only. (``kind`` and ``variant`` are marin's fields: always "cpu".)"""

    kind: str = "cpu"
    variant: str = "cpu"

    def __post_init__(self) -> None:
        if (self.kind, self.variant) != ("cpu", "cpu"):
            raise ConfigError(f"CpuConfig(kind={self.kind!r}, variant={self.variant!r}): both are always 'cpu'")

    def default_env_vars(self) -> dict[str, str]:
        """What a job on this device gets in its environment unless it sets them: JAX runs on the CPU."""
        return {"JAX_PLATFORMS": "cpu"}

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
    "GB200",
    "GB300",
    "H100",
    "H200",
    "L4",
    "L40S",
    "T4",
    "V100",
)


def _canonical_gpu(name: str) -> str:
    """A GPU type as :data:`GPU_TYPES` spells it (``"a100-80g"`` is ``"A100-80G"``, as marin's names are)."""
    if isinstance(name, str) and name not in GPU_TYPES:
        for known in GPU_TYPES:
            if known.lower() == name.lower():
                return known
    return name


@dataclass(frozen=True, init=False)
class GpuConfig:
    """``count`` GPUs of ``type`` per task (``"auto"``: any GPU type).

    ``variant`` is marin's spelling of ``type`` (``GpuConfig(variant="H100", count=8)``):
    accepted as a keyword and readable as a property; ``type`` is canonical.
    """

    type: str = "auto"
    count: int = 1
    kind: str = field(default="gpu", init=False)

    def __init__(
        self, type: str | None = None, count: int = 1, *, variant: str | None = None, kind: str = "gpu"
    ) -> None:
        if kind != "gpu":
            raise ConfigError(f"GpuConfig(kind={kind!r}): a GpuConfig's kind is always 'gpu'")
        object.__setattr__(self, "type", _canonical_gpu(_one_spelling("GpuConfig", type, variant, "auto")))
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "kind", "gpu")
        self.__post_init__()

    def default_env_vars(self) -> dict[str, str]:
        """What a job on this device gets in its environment unless it sets them: JAX picks the GPU."""
        return {"JAX_PLATFORMS": ""}

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
            raise ConfigError(f"GpuConfig(type={self.type!r}) is not a known GPU type; known: {', '.join(GPU_TYPES)}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigError(f"GpuConfig(count={self.count!r}) must be a whole number >= 1")


@dataclass(frozen=True)
class TpuTopology:
    """One TPU slice shape: how many chips, over how many hosts (TPU VMs, the unit that is scheduled)."""

    name: str
    family: str
    chips: int
    hosts: int
    chips_per_host: int
    topology: str
    machines: int = 0
    """Physical machines when they differ from :attr:`hosts` (a v5e machine holds two 4-chip VMs); 0: the same."""

    # marin's names for the same facts (its ``TpuTopologyInfo``).
    @property
    def chip_count(self) -> int:
        """marin's name for :attr:`chips`."""
        return self.chips

    @property
    def host_count(self) -> int:
        """Physical machines of the slice (marin's ``host_count``)."""
        return self.machines or self.hosts

    @property
    def vm_count(self) -> int:
        """TPU VMs in the slice (marin's name for :attr:`hosts`)."""
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
    # v5p also comes in every multiple of 128 TensorCores up to 12288 (marin's list): a 4x4xN torus
    # where no cube has that size (GCP picks the actual shape when it creates the slice).
    cubes = {row.name for row in rows}
    for cores in range(384, 12289, 128):
        if f"v5p-{cores}" not in cubes:
            chips = cores // 2
            rows.append(TpuTopology(f"v5p-{cores}", "v5p", chips, chips // 4, 4, f"4x4x{chips // 16}"))
    # v5e and v6e: the name counts chips; single-host slices hold up to 8 chips,
    # multi-host slices put 4 chips on each host (VM), 2D torus. A v5e machine holds two such VMs.
    flat = [(1, "1x1"), (4, "2x2"), (8, "2x4"), (16, "4x4"), (32, "4x8"), (64, "8x8"), (128, "8x16"), (256, "16x16")]
    for family, prefix in (("v5e", "v5litepod"), ("v6e", "v6e")):
        for chips, topo in [(2, "1x2"), *flat] if family == "v5e" else flat:
            hosts = 1 if chips <= 8 else chips // 4
            machines = chips // 8 if family == "v5e" and hosts > 1 else 0
            rows.append(TpuTopology(f"{prefix}-{chips}", family, chips, hosts, chips // hosts, topo, machines))
    return {row.name: row for row in rows}


TPU_TOPOLOGIES: dict[str, TpuTopology] = _tpu_table()
"""Known TPU slice types (``"v4-8"``, ``"v5litepod-16"``, ``"v5p-64"``, ``"v6e-256"``, ...)."""


@dataclass(frozen=True)
class TpuHostResources:
    """The cpu and RAM of one host VM of a TPU family (marin's sizing of ``with_tpu``)."""

    cpu: int
    ram_gb: int


TPU_HOST_RESOURCES: dict[str, TpuHostResources] = {
    "v4": TpuHostResources(cpu=240, ram_gb=400),
    "v5e": TpuHostResources(cpu=112, ram_gb=192),
    "v5p": TpuHostResources(cpu=208, ram_gb=448),
    "v6e": TpuHostResources(cpu=180, ram_gb=720),
}
"""One host VM of each TPU family: what ``ResourceConfig.with_tpu`` sizes cpu and ram from."""

DEFAULT_TPU_HOST_FRACTION = 0.5
"""The share of a TPU host's cpu and RAM that ``ResourceConfig.with_tpu`` asks for by default."""

TpuFamily = Literal["v4", "v5e", "v5p", "v6e"]
"""The TPU families Fray knows (marin's ``fray.types.TpuFamily``)."""

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

    def __init__(
        self, type: str | None = None, topology: str | None = None, *, variant: str | None = None, kind: str = "tpu"
    ) -> None:
        if kind != "tpu":
            raise ConfigError(f"TpuConfig(kind={kind!r}): a TpuConfig's kind is always 'tpu'")
        object.__setattr__(self, "type", _one_spelling("TpuConfig", type, variant, None))
        object.__setattr__(self, "topology", topology)
        object.__setattr__(self, "kind", "tpu")
        self.__post_init__()

    @property
    def variant(self) -> str:
        """marin's name for :attr:`type`."""
        return self.type

    def default_env_vars(self) -> dict[str, str]:
        """What a job on this device gets in its environment unless it sets them (as marin sets them).

        JAX picks the TPU, and libtpu gets the larger scoped VMEM limit marin's training runs use.
        """
        return {"JAX_PLATFORMS": "", "LIBTPU_INIT_ARGS": "--xla_tpu_scoped_vmem_limit_kib=50000"}

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


class DeviceNames(tuple[str, ...]):
    """``ResourceConfig.device_alternatives`` as kept: device names, a tuple that also equals the same list.

    marin's code compares the field with a list (``rc.device_alternatives == ["v5p-8"]``); a
    tuple keeps the frozen ``ResourceConfig`` hashable.
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return tuple.__eq__(self, tuple(other) if isinstance(other, list) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__


ANY_REGION = "*"
"""``regions=[ANY_REGION]``: anywhere, said explicitly (marin's spelling). ``regions=None`` leaves it unset:
anywhere too, except on Iris, where a child job then inherits its parent's region."""

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
    target_cluster: str | None = None
    replicas: int = 1
    device_alternatives: Sequence[DeviceConfig | str] | None = None
    image: str | None = None
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
        if self.regions is not None:
            if isinstance(self.regions, str):
                raise ConfigError(
                    f"ResourceConfig(regions={self.regions!r}) must be a list of regions, e.g. [{self.regions!r}]"
                )
            regions = tuple(self.regions)
            # ANY_REGION beside a region is kept as given and refused where the work is placed
            # (placement_regions), as marin refuses it: code may build such a request and never place it.
            bad = [r for r in regions if not isinstance(r, str) or not (r == ANY_REGION or _REGION_RE.match(r))]
            if bad or not regions:
                raise ConfigError(
                    f"ResourceConfig(regions={self.regions!r}): give a non-empty list of region names "
                    "such as ['us-central1'], or None for anywhere"
                )
            object.__setattr__(self, "regions", regions)
        if self.zone is not None:
            if not isinstance(self.zone, str) or not _REGION_RE.match(self.zone):
                raise ConfigError(f"ResourceConfig(zone={self.zone!r}) must be a zone name such as 'us-central1-a'")
            places = [r for r in self.regions or () if r != ANY_REGION]
            if places and not any(self.zone.startswith(f"{r}-") for r in places):
                raise ConfigError(
                    f"ResourceConfig(zone={self.zone!r}, regions={list(self.regions or ())!r}): the zone is in none of "
                    "the regions; drop one of them or make them agree"
                )
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise ConfigError(f"ResourceConfig(replicas={self.replicas!r}) must be a whole number >= 1")
        for name in ("image", "target_cluster", "container_profile"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"ResourceConfig({name}={value!r}) must be a non-empty string or None")
        if self.device_alternatives is not None:
            self._alternatives()

    def _alternatives(self) -> None:
        """Keep ``device_alternatives`` in marin's form: the names of the devices that would do besides ``device``.

        Given as devices (Fray's form: every choice, the first most wanted, ``device`` left
        default or equal to the first) or as names (marin's: the choices besides ``device``).
        """
        given = self.device_alternatives
        if isinstance(given, CpuConfig | GpuConfig | TpuConfig | str) or not isinstance(given, Sequence):
            raise ConfigError(
                f"ResourceConfig(device_alternatives={given!r}) must be a list of devices, e.g. "
                "[TpuConfig('v5litepod-16'), TpuConfig('v6e-16')], or of names besides device, e.g. ['v6e-16']"
            )
        items = list(given)
        bad = [d for d in items if not isinstance(d, CpuConfig | GpuConfig | TpuConfig | str)]
        if bad or not items:
            raise ConfigError(
                f"ResourceConfig(device_alternatives={given!r}): give a non-empty list of CpuConfig, GpuConfig or "
                "TpuConfig values, or of device names"
            )
        names = [d for d in items if isinstance(d, str)]
        if len(names) == len(items) and not isinstance(self.device, CpuConfig):
            choices = [self.device, *(self._device_named(d) for d in names)]  # marin's form: besides device
        else:
            choices = [self._device_named(d) if isinstance(d, str) else d for d in items]
            if not isinstance(self.device, CpuConfig) and self.device != choices[0]:
                raise ConfigError(
                    f"ResourceConfig(device={self.device!r}, device_alternatives=...): give the devices in "
                    "device_alternatives only (the first is the one most wanted)"
                )
        if len(set(choices)) != len(choices):
            raise ConfigError(f"ResourceConfig(device_alternatives={given!r}) names a device twice")
        object.__setattr__(self, "device", choices[0])
        object.__setattr__(self, "device_alternatives", DeviceNames(self._name_of(d) for d in choices[1:]))

    def _device_named(self, name: str) -> DeviceConfig:
        # A bare GPU type beside a GPU device means as many GPUs of that type (marin's "GB300" beside 4 GB200s).
        if isinstance(self.device, GpuConfig) and _canonical_gpu(name) in GPU_TYPES:
            return GpuConfig(name, self.device.count)
        return _device_from_name(name)

    def _name_of(self, device: DeviceConfig) -> str:
        if isinstance(device, TpuConfig):
            return device.type
        if isinstance(device, GpuConfig) and isinstance(self.device, GpuConfig) and device.count == self.device.count:
            return device.type
        return device_name(device)

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
        """``slice_count`` TPU slices of ``tpu_type``, sized as marin sizes them.

        A list of types is a choice, the first most wanted (``device_alternatives``); they must
        share their VM count and chips per VM (a TPU VM is what is scheduled). ``replicas`` is
        the number of tasks, one per TPU VM of every slice (marin's count); a job of these
        resources runs ``slice_count`` Fray replicas, one per slice (:attr:`replica_count`).
        ``cpu`` and ``ram`` default to :data:`DEFAULT_TPU_HOST_FRACTION` of the first type's
        host (:data:`TPU_HOST_RESOURCES`), ``disk`` to 50g; give them to override.
        """
        names = [tpu_type] if isinstance(tpu_type, str) else list(tpu_type)
        if not names:
            raise ConfigError("ResourceConfig.with_tpu needs a non-empty TPU type or list of types, e.g. 'v5p-8'")
        if isinstance(slice_count, bool) or not isinstance(slice_count, int) or slice_count < 1:
            raise ConfigError(f"ResourceConfig.with_tpu(slice_count={slice_count!r}) must be a whole number >= 1")
        devices = [TpuConfig(name) for name in names]
        shapes = {(d.slice.vm_count, d.slice.chips_per_vm) for d in devices}
        if len(shapes) > 1:
            raise ConfigError(
                f"ResourceConfig.with_tpu({names!r}): the types must share vm_count and chips_per_vm (a TPU VM is "
                "what is scheduled, so slices of other shapes cannot stand in for each other)"
            )
        host = TPU_HOST_RESOURCES[devices[0].slice.family]
        sized: dict[str, object] = {
            "cpu": max(1, int(host.cpu * DEFAULT_TPU_HOST_FRACTION)),
            "ram": f"{int(host.ram_gb * DEFAULT_TPU_HOST_FRACTION)}g",
            "disk": "50g",
        }
        sized.update(kwargs)
        return ResourceConfig(
            device=devices[0],
            device_alternatives=names[1:] or None,
            replicas=slice_count * devices[0].slice.vm_count,
            **sized,  # type: ignore[arg-type]
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
            raise ConfigError(
                "ResourceConfig.scale: give either a single factor for all, or cpu=/ram=/disk= factors, not both"
            )
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
        """Accelerator chips over all replicas (:attr:`replica_count`): GPUs, or each TPU slice's chips; 0 for CPU."""
        return self.device.chip_count() * self.replica_count

    @property
    def replica_count(self) -> int:
        """The Fray replicas :attr:`replicas` makes: whole slices for a multi-VM TPU, else the same number.

        ``replicas`` counts tasks, one per TPU VM (marin's count, what ``with_tpu`` sets); a
        Fray replica of a TPU job is a whole slice. What a :class:`~fray.job.JobRequest` runs
        when it gives no ``replicas`` of its own.
        """
        if not isinstance(self.device, TpuConfig):
            return self.replicas
        vms = self.device.slice.vm_count
        if self.replicas <= vms:
            return 1
        if self.replicas % vms:
            raise ConfigError(
                f"ResourceConfig(replicas={self.replicas}) counts tasks, one per TPU VM, and a {self.device.type} "
                f"slice has {vms} VMs: give a multiple of {vms} (ResourceConfig.with_tpu(..., slice_count=N) does)"
            )
        return self.replicas // vms

    def device_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s of one chip of :attr:`device` (0.0 for CPU or an unrated device)."""
        return self.device.device_flops(dtype)

    def total_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s of all chips over all replicas."""
        return self.device_flops(dtype) * self.chip_count()

    @property
    def placement_regions(self) -> tuple[str, ...] | None:
        """The regions the work may be placed in, None for anywhere (``regions`` None or ``[ANY_REGION]``).

        Every backend places by this; ``ANY_REGION`` beside another region is a ConfigError here.
        """
        if self.regions is None:
            return None
        regions = tuple(self.regions)
        if ANY_REGION not in regions:
            return regions
        if len(regions) > 1:
            raise ConfigError(
                f"ResourceConfig(regions={list(regions)!r}): ANY_REGION cannot be combined with other regions; give "
                "[ANY_REGION] for anywhere, or only the regions you want"
            )
        return None

    @property
    def device_choices(self) -> tuple[DeviceConfig, ...]:
        """The devices the work may run on, most wanted first (just ``device`` without alternatives)."""
        if not self.device_alternatives:
            return (self.device,)
        # Kept as names once built (_alternatives).
        return (self.device, *(self._device_named(str(name)) for name in self.device_alternatives))

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
