"""Shared fixtures. Each backend's fixtures live in ``tests/backends/<name>.py``."""

pytest_plugins = [
    "backends.local",
    "backends.cluster",
    "backends.ray",
    "backends.iris",
    "backends.monarch",
    "backends.contexts",
]
