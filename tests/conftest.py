"""Shared fixtures. Each backend's fixtures live in ``tests/backends/<name>.py``."""

pytest_plugins = [
    "backends.local",
    "backends.cluster",
    "backends.ray",
    "backends.iris",
    "backends.monarch",
    "backends.contexts",
]


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "runs_early(work): the test checks what work(**params) returned, run in the background "
        "from the session's start (tests/early.py)",
    )


def pytest_collection_modifyitems(config, items):
    # Tests that check an early run go last: their runs have had the whole session to finish (tests/early.py).
    late = [item for item in items if item.get_closest_marker("runs_early")]
    if late:
        items[:] = [item for item in items if not item.get_closest_marker("runs_early")] + late


def pytest_collection_finish(session):
    import early

    for item in session.items:
        marker = item.get_closest_marker("runs_early")
        if marker is not None:
            early.start(item.nodeid, marker.args[0], early.params_of(item))


def pytest_sessionfinish(session, exitstatus):
    import early

    early.stop()
