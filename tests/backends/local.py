"""Fixtures for the embedded local backend."""

from collections.abc import Iterator

import pytest

from fray.local import LocalClient


@pytest.fixture
def local_client() -> Iterator[LocalClient]:
    """A fresh local client per test: it is cheap, and isolation is free.

    Built as users build it: by default it checks that what it is given pickles, as every
    other backend must, so the conformance suite holds the default to the cluster's rules.
    """
    client = LocalClient()
    yield client
    client.shutdown(wait=False)
