"""Sizes in bytes as people write them (``"512m"``, ``"4g"``, ``"1.5t"``, ``"2GiB"``): parsing and rendering.

:mod:`fray.resources` re-exports :func:`parse_size` and :func:`format_size` (their public home)
and checks :class:`~fray.resources.ResourceConfig`'s ``ram`` and ``disk`` with :func:`check_size`.
"""

from __future__ import annotations

import re

from fray.errors import ConfigError

__all__ = ["check_size", "format_size", "parse_size", "scaled_size"]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}

# Size texts already read, and those a ResourceConfig accepted: every job request makes a
# ResourceConfig, nearly always with the same few sizes, and two regex matches per size were
# a sizeable part of building one. Bounded, in case a program makes up sizes without end.
_CACHE_LIMIT = 1024
_bytes_of: dict[str, int] = {}
_checked: set[str] = set()


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
    known = _bytes_of.get(value)
    if known is not None:
        return known
    match = _SIZE_RE.match(value)
    if match is None:
        raise ConfigError(
            f"{what}={value!r} is not a size: use a number with an optional unit k, m, g, t or p "
            "(powers of 1024), e.g. '512m', '4g', '1.5t', '2GiB'"
        )
    number, unit, _ = match.groups()
    result = int(float(number) * _UNITS[unit.lower()])
    if len(_bytes_of) < _CACHE_LIMIT:
        _bytes_of[value] = result
    return result


def format_size(num_bytes: int) -> str:
    """Render a byte count the way :func:`parse_size` reads it (``"1.5g"``)."""
    for unit in ("p", "t", "g", "m", "k"):
        scale = _UNITS[unit]
        if num_bytes >= scale:
            return f"{num_bytes / scale:.4g}{unit}"
    return f"{num_bytes}b"


def scaled_size(num_bytes: int, factor: float) -> str:
    """``num_bytes * factor`` as a size string, in the largest unit that holds it exactly."""
    scaled = int(num_bytes * factor)
    for unit in ("p", "t", "g", "m", "k"):
        if scaled and scaled % _UNITS[unit] == 0:
            return f"{scaled // _UNITS[unit]}{unit}"
    return f"{scaled}b"


def check_size(name: str, value: str | int) -> None:
    """A ResourceConfig size must say its unit: a bare number is refused rather than guessed."""
    if type(value) is str and value in _checked:
        return
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
    if type(value) is str and len(_checked) < _CACHE_LIMIT:
        _checked.add(value)
