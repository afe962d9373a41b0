"""Large arguments and results on every backend: each value comes back with its type and its contents.

Sizes span the transports' thresholds (out of band from 64 KiB, memfds from 1 MiB, new
bytes/bytearray objects filled in place from 4 KiB, huge pages from 4 MiB on fray://).
Speed is measured in ``benchmarks/actor_rpc.py``; here only what the caller gets back.
"""

from __future__ import annotations

import numpy as np
import pytest

from support import TYPED_VALUES, typed


class Echo:
    def echo(self, value):
        return value

    def describe(self, value) -> tuple[str, int, int]:
        """What the actor received: its type, its length and a checksum of its bytes."""
        data = bytes(value)
        return type(value).__name__, len(data), sum(data[::4093])


@pytest.mark.parametrize("size", [5000, 300_000, 5 << 20], ids=["5KB", "300KB", "5MiB"])
def test_large_values_keep_their_type_and_contents(client, uid, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    raw = data.tobytes()
    actor = client.create_actor(Echo, name=f"big-{uid}")
    for value in (raw, bytearray(raw)):
        assert actor.describe(value) == (type(value).__name__, size, sum(raw[::4093]))
        back = actor.echo(value)
        assert type(back) is type(value) and back == value
    back_bytes = actor.echo({"payload": raw, "again": [raw]})  # nested in a result, and twice
    assert back_bytes["payload"] == raw and back_bytes["again"][0] == raw and type(back_bytes["payload"]) is bytes
    assert hash(back_bytes["payload"]) == hash(raw)  # an ordinary bytes object, usable as a key
    array = actor.echo(data)
    assert isinstance(array, np.ndarray) and np.array_equal(array, data)


def test_small_values_keep_their_type_as_arguments_results_and_constructor_arguments(client, uid):
    actor = client.create_actor(Holder, bytearray(b"first"), second={"k": bytearray(b"second")}, name=f"typed-{uid}")
    assert typed(actor.held()) == typed([bytearray(b"first"), {"k": bytearray(b"second")}])
    for value in TYPED_VALUES:
        assert typed(actor.echo(value)) == typed(value)
        assert typed(actor.echo.remote(value).result(timeout=60)) == typed(value)
        assert typed(actor.echo(value=value)) == typed(value)


class Holder(Echo):
    def __init__(self, first, second) -> None:
        self._held = [first, second]

    def held(self):
        return self._held
