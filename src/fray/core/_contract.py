"""The backend contract, checked statically: every backend's client class is a :class:`~fray.client.Client`.

Backends are loaded by scheme through ``importlib`` (:func:`fray.client.client_from_spec`),
so nothing in the program hands mypy a backend where a ``Client`` is expected; the
functions below do. Each would fail ``mypy`` the day a backend's public method stops
matching the protocol (a missing keyword such as ``submit(detached=)``, another return
type). Nothing imports this module at run time. The conformance suite checks the same
signatures at run time (``tests/conformance/test_contract.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fray.client import Client
    from fray.cluster.client import ClusterClient
    from fray.iris.client import IrisClient
    from fray.local import LocalClient
    from fray.monarch.client import MonarchClient
    from fray.ray.client import RayClient

__all__: list[str] = []


def _local(client: LocalClient) -> Client:
    return client


def _cluster(client: ClusterClient) -> Client:
    return client


def _ray(client: RayClient) -> Client:
    return client


def _monarch(client: MonarchClient) -> Client:
    return client


def _iris(client: IrisClient) -> Client:
    return client
