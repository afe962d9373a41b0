"""What one task or actor needs: cpu, memory, disk, an accelerator, placement constraints.

All types here are frozen dataclasses validated at construction, so a typo such as
``ram="4gg"`` fails where it was written, with a message saying what is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from fray.errors import ConfigError

__all__ = [
    "GPU_TYPES",
    "TPU_TOPOLOGIES",
    "CpuConfig",
    "DeviceConfig",
    "GpuConfig",
    "ResourceConfig",
    "TpuConfig",
    "TpuTopology",
    "device_name",
    "format_size",
    "parse_device_name",
    "parse_size",
]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_size(value: str | int, *, what: str = "size") -> int:
    """Parse a human size such as ``"512m"``, ``"4g"``, ``"1.5t"`` or ``"4GiB"`` into bytes.

    Units are powers of 1024 (k, m, g, t, p, optionally followed by ``b`` or ``ib``,
    any case); ``"512b"``, a number without a unit, or a bare integer is a number of
    bytes. (:class:`ResourceConfig` is stricter: it wants a unit, see there.)
    """
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a size like '512m' or '4g', not a bool")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{what} must not be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a size string like '512m', '4g' or '1.5t', got {value!r}")
    match = _SIZE_RE.match(value)
    if match is None:
        raise ConfigError(
            f"{what}={value!r} is not a size: use a number with an optional unit k, m, g, t or p "
            "(powers of 1024), e.g. '512m', '4g', '1.5t', '2GiB'"
        )
    number, unit, _ = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def format_size(num_bytes: int) -> str:
    """Render a byte count the way :func:`parse_size` reads it (``"1.5g"``)."""
    for unit in ("p", "t", "g", "m", "k"):
        scale = _UNITS[unit]
        if num_bytes >= scale:
            return f"{num_bytes / scale:.4g}{unit}"
    return f"{num_bytes}b"


@dataclass(frozen=True)
class CpuConfig:
    """No accelerator: the task runs on CPUs only."""

    kind: str = field(default="cpu", init=False)


# Accelerator types Fray knows how to map onto each engine. Typos are the common
# failure, so unknown names are rejected rather than passed through.
GPU_TYPES: tuple[str, ...] = (
    "auto",
    "A10",
    "A10G",
    "A100",
    "A100-40G",
    "A100-80G",
    "B200",
    "H100",
    "H200",
    "L4",
    "L40S",
    "T4",
    "V100",
)


@dataclass(frozen=True)
class GpuConfig:
    """``count`` GPUs of ``type`` per task (``"auto"``: any GPU type)."""

    type: str = "auto"
    count: int = 1
    kind: str = field(default="gpu", init=False)

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


@dataclass(frozen=True)
class TpuConfig:
    """One TPU slice of ``type`` (e.g. ``"v5litepod-16"``); ``topology`` may be given to double-check."""

    type: str
    topology: str | None = None
    kind: str = field(default="tpu", init=False)

    def __post_init__(self) -> None:
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


def _check_size(name: str, value: str | int) -> None:
    """A ResourceConfig size must say its unit: a bare number is refused rather than guessed."""
    bare = None
    if isinstance(value, int) and not isinstance(value, bool):
        bare = str(value)
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is not None and not match.group(2) and not match.group(3):
            bare = match.group(1)
    if bare is not None:
        raise ConfigError(
            f"ResourceConfig({name}={value!r}): a bare number is ambiguous (bytes? GiB?); write a size with a "
            f"unit, e.g. {name}='4g' or '512m' ('{bare}b' for {bare} bytes)"
        )
    parse_size(value, what=f"ResourceConfig.{name}")


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
    """

    cpu: float = 1
    ram: str = "128m"
    disk: str = "1g"
    device: DeviceConfig = field(default_factory=CpuConfig)
    preemptible: bool = True
    regions: Sequence[str] | None = None
    zone: str | None = None
    device_alternatives: Sequence[DeviceConfig] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.cpu, bool) or not isinstance(self.cpu, int | float) or not math.isfinite(self.cpu):
            raise ConfigError(f"ResourceConfig(cpu={self.cpu!r}) must be a number of cores, e.g. 1 or 0.5")
        if self.cpu < 0:
            raise ConfigError(f"ResourceConfig(cpu={self.cpu!r}) must not be negative")
        _check_size("ram", self.ram)
        _check_size("disk", self.disk)
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
        if self.device_alternatives is not None:
            self._check_alternatives()

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
