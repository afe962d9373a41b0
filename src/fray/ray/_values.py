"""Values Fray hands to Ray keep their type.

Ray serializes a top-level value, and lists and dicts, with msgpack when it can, and
msgpack turns every ``bytearray`` in them into ``bytes`` (a bytearray inside a tuple or
an object survives: those go through pickle). Every other backend gives back what was
sent, so every value Fray passes to Ray -- an actor's arguments and results, a task's
result, ``put``, a queue item -- goes through :func:`shield` first: a bytearray, list or
dict travels inside a small wrapper that Ray pickles (out-of-band buffers included), and
comes out as itself.
"""

from __future__ import annotations

from typing import Any

__all__ = ["shield", "shield_call"]

_MSGPACKED = (bytearray, list, dict)


class _Pickled:
    """Holds a value Ray must pickle rather than msgpack; unpickles as the value itself."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return _itself, (self.value,)


def _itself(value: Any) -> Any:
    return value


def shield(value: Any) -> Any:
    """``value``, wrapped if Ray would msgpack it (see the module docstring)."""
    return _Pickled(value) if type(value) in _MSGPACKED else value


def shield_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call's arguments, each shielded."""
    return tuple(shield(a) for a in args), {k: shield(v) for k, v in kwargs.items()}
