"""What a RayClient ships (fray.ray._shipping): arguments take plain pickle only when it gives the same bytes' meaning."""

from __future__ import annotations

import enum
import pickle

from fray import Entrypoint, JobRequest
from fray.ray._shipping import Shipping, _plain


class Color(enum.Enum):
    RED = 1


def add(a: int, b: int = 0) -> int:
    return a + b


def test_only_scalars_and_builtin_containers_are_plain():
    assert _plain(((1, "a", None, b"x", 2.5, True, [1, 2], {"k": 1}), {"b": (3,)}))
    assert not _plain(((lambda: 1,), {}))
    assert not _plain(((Color.RED,), {}))  # an enum (perhaps of __main__): cloudpickle
    assert not _plain(((bytearray(b"x"),), {}))
    assert not _plain(((tuple(range(100)),), {}))  # large: cloudpickle costs little next to it
    assert not _plain((({1: "int key"},), {}))


def test_both_ways_ship_the_same_call():
    shipping = Shipping()
    for args in [(1,), (lambda: 1,), (Color.RED,)]:
        request = JobRequest(name="add", entrypoint=Entrypoint.from_callable(add, args=args, kwargs={"b": 2}))
        _, shipped = shipping.entry(request)
        got_args, got_kwargs = pickle.loads(shipped)
        assert got_kwargs == {"b": 2} and len(got_args) == 1
        assert got_args[0] == args[0] if not callable(args[0]) else got_args[0]() == 1
