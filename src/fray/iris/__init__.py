"""Fray on Iris, the marin project's cluster manager (``pip install "fray[iris]"``, Python >= 3.12).

``FRAY_CLIENT_SPEC=iris://HOST:PORT[?workspace=PATH]``, or :class:`fray.iris.client.IrisClient`
directly; inside an Iris task, ``fray.current_client()`` finds the cluster by itself. See
``docs/iris.md`` for how each Fray field maps onto Iris.

This package imports nothing on purpose: every Fray task on Iris imports
:mod:`fray.iris._task`, and importing Iris's client costs most of a second per task.
"""
