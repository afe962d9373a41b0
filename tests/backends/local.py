"""Fixtures for the embedded local backend."""

from collections.abc import Iterator

import pytest

from fray.local import LocalClient


@pytest.fixture
def local_client() -> Iterator[LocalClient]:
    """A fresh local client per test: it is cheap, and isolation is free."""
    client = LocalClient()
    yield client
    client.shutdown(wait=False)
