"""Fixtures for the embedded local backend."""

from collections.abc import Iterator

import pytest

from fray.local import LocalClient


@pytest.fixture
def local_client() -> Iterator[LocalClient]:
    """A fresh local client per test: it is cheap, and isolation is free.

    It checks that what it is given pickles (``check_pickling``), as every other backend
    must, so that the conformance suite holds the local backend to the cluster's rules.
    """
    client = LocalClient(check_pickling=True)
    yield client
    client.shutdown(wait=False)
