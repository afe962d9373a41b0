"""The controller's API has one server method per name the client proxy calls, and no name served twice."""

from __future__ import annotations

import inspect
import re

from fray.cluster.protocol.controller_client import ControllerProxy
from fray.cluster.server.controller._api import _ADMIN_METHODS, ControllerAPI


def _served() -> tuple[set[str], set[str]]:
    """The plain table, and the names that depend on the caller (per-caller and the administrator's)."""
    api = ControllerAPI(service=object())  # the tables only: nothing is called
    return set(api._methods), set(api._personal) | _ADMIN_METHODS


def test_every_method_the_client_proxy_calls_is_served():
    called = set(re.findall(r'_call\("([a-z_]+)"', inspect.getsource(ControllerProxy)))
    plain, personal = _served()
    assert called, "the proxy's calls were not found"
    assert not called - (plain | personal), (
        f"the proxy calls methods the controller does not serve: {called - (plain | personal)}"
    )


def test_no_method_is_in_two_tables():
    # The caller's tables are looked up first: a name also in the plain table would leave that entry dead code.
    plain, personal = _served()
    assert not plain & personal, f"served twice (the plain entry is dead): {sorted(plain & personal)}"
