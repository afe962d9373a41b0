"""Random ids (fray.core._client_core.random_hex): unique within a process and across a fork."""

from __future__ import annotations

import os

import pytest

from fray.core._client_core import random_hex, short_id


def test_ids_have_their_length_and_do_not_repeat():
    ids = {random_hex(16) for _ in range(10_000)}
    assert len(ids) == 10_000 and all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    assert len(short_id()) == 8


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_draws_other_ids_than_its_parent():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then leave without running the parent's cleanup
        os.write(write, random_hex(16).encode())
        os._exit(0)
    os.close(write)
    parent = random_hex(16)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 16 and child != parent
