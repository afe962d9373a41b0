"""marin's ``fray.current_client`` module: ``current_client``, ``set_current_client``, ``_current_client_var``.

Fray's package also has a *function* ``fray.current_client``. Importing this module
rebinds ``fray.current_client`` to the module, so the module is made callable: calling
it calls :func:`fray.client.current_client`. Both ``fray.current_client()`` and
``from fray.current_client import current_client`` work, whichever was imported first.
"""

from __future__ import annotations

import importlib
import sys
import types

from fray.client import Client, current_client, set_current_client
from fray.client import _current as _current_client_var
from fray.local import MarinLocalClient as LocalClient

# LocalClient: marin's module offers the client it falls back to, which is Fray's too.
__all__ = ["Client", "LocalClient", "current_client", "set_current_client"]


class _CallableModule(types.ModuleType):
    """This module, callable as the function it is named after."""

    def __call__(self) -> Client:
        return current_client()

    def __reduce__(self) -> tuple[object, tuple[str]]:
        # A function shipped by value may hold it (``from fray import current_client`` after this module
        # was imported gives the module): it travels as a reference, as plain modules do.
        return importlib.import_module, (self.__name__,)


sys.modules[__name__].__class__ = _CallableModule
_ = _current_client_var  # re-exported for marin's code, which sets it directly
