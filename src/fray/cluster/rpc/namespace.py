"""Namespaces and the cluster token: the defaults every RPC component takes from the environment.

Actor names are isolated per namespace. A Fray run's root job starts a namespace
and its child jobs inherit it through ``FRAY_NAMESPACE``; a process that only has
``FRAY_JOB_ID`` (``root-abc123/child-def456``) uses its root component. Processes
outside any job share :data:`DEFAULT_NAMESPACE`. Callers that want to see actors
across runs opt into :data:`GLOBAL_NAMESPACE` explicitly.
"""

from __future__ import annotations

import os

from fray.errors import ConfigError

__all__ = ["DEFAULT_NAMESPACE", "GLOBAL_NAMESPACE", "default_namespace", "default_token", "resolve_namespace"]

#: The namespace of processes that run outside any Fray job.
DEFAULT_NAMESPACE = "default"
#: A namespace shared by every job that names it explicitly.
GLOBAL_NAMESPACE = "global"


def default_namespace() -> str:
    """``FRAY_NAMESPACE``, else the root component of ``FRAY_JOB_ID``, else :data:`DEFAULT_NAMESPACE`."""
    namespace = os.environ.get("FRAY_NAMESPACE", "").strip()
    if namespace:
        return namespace
    job_id = os.environ.get("FRAY_JOB_ID", "").strip().strip("/")
    if job_id:
        return job_id.split("/", 1)[0]
    return DEFAULT_NAMESPACE


def resolve_namespace(namespace: str | None) -> str:
    """``namespace`` if given (validated), else :func:`default_namespace`."""
    if namespace is None:
        return default_namespace()
    if not isinstance(namespace, str) or not namespace or "/" in namespace:
        raise ConfigError(f"namespace must be a non-empty string without '/', got {namespace!r}")
    return namespace


def default_token(token: str | bytes | None) -> bytes | None:
    """The token to use: ``token`` if given, else ``FRAY_TOKEN``; None when neither is set (or empty)."""
    if token is None:
        token = os.environ.get("FRAY_TOKEN") or None
    if token is None or token in ("", b""):
        return None
    return token.encode() if isinstance(token, str) else bytes(token)
