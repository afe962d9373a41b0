"""How a worker joins the controller, and the one line it gives up with when it cannot.

A join token (``fray worker --join TOKEN``) is checked here; the credential a worker got with
one is kept in its workdir and reused when it starts again with the same token (or none). An
answer that retrying cannot change -- a refused credential, a server that is not the cluster's --
is turned into the one line the worker stops with (see :mod:`fray.cluster.server.worker`).
"""

from __future__ import annotations

from pathlib import Path

from fray.cluster.protocol.credentials import Credential, issued_id
from fray.cluster.rpc.tls import UntrustedServerError
from fray.errors import AuthenticationError, ConfigError, PermissionDenied

__all__ = ["join_token", "refusal_line", "revoked", "stored_credential"]


def join_token(line: str) -> Credential:
    """The join token in ``line``; ConfigError (one line saying what it should be) if it is not one."""
    try:
        token = Credential.decode(line)
    except ConfigError:
        token = None
    if token is None or not token.principal.startswith("join:"):
        raise ConfigError(
            "--join takes the one line `fray token create --role worker` printed (fray-credential-v1 join:...), "
            "and this is not one"
        )
    return token


def revoked(worker_id: str, controller: str, exc: Exception) -> str | None:
    """The line a registered worker gives up with when the controller refuses its credential, else None."""
    # PermissionDenied: a revoked worker's shared credential may still connect, but not register it.
    if not isinstance(exc, (AuthenticationError, PermissionDenied)) or isinstance(exc, UntrustedServerError):
        return None
    return (
        f"worker {worker_id}: the controller at {controller} refused its credential (revoked: fray worker revoke) "
        "and its tasks were stopped -- join again with a new token: fray worker --join TOKEN "
        "(fray token create --role worker makes one)"
    )


def refusal_line(worker_id: str, controller: str, exc: Exception, *, joining: bool = False) -> str | None:
    """The one line a worker gives up with when ``exc`` is an answer retrying cannot change, else None.

    Connection failures (``CallNotSentError``, timeouts, a lost connection) are None: the
    controller may not be up yet, or be restarting.
    """
    lines = str(exc).strip().splitlines()
    detail = lines[0] if lines else type(exc).__name__
    if joining and isinstance(exc, UntrustedServerError):
        fix = "the join token pins another controller's CA: check --controller, or mint a token on that controller"
    elif joining and isinstance(exc, (AuthenticationError, PermissionDenied)):
        fix = (
            "the join token, or the credential this worker got with it earlier, is expired, revoked or another "
            "cluster's: mint a new token with `fray token create --role worker` on the controller's machine"
        )
    elif isinstance(exc, UntrustedServerError):
        fix = (
            "set FRAY_TLS_CA to the CA of the controller's cluster (`fray controller` prints its path when it starts) "
            "and check that --controller names that controller"
        )
    elif isinstance(exc, AuthenticationError):
        fix = (
            "give the worker that cluster's worker credential (FRAY_CREDENTIAL; `fray cluster up` keeps it in "
            "worker.credential) or its token (FRAY_TOKEN), and check that --controller names that cluster's controller"
        )
    elif isinstance(exc, PermissionDenied):
        fix = "set FRAY_CREDENTIAL to the cluster's worker credential (worker.credential in the cluster directory)"
    elif isinstance(exc, ConfigError):
        fix = "fix the setting and start the worker again"
    else:
        return None
    return f"worker {worker_id} cannot join the controller at {controller}: {detail} -- {fix}"


def stored_credential(credential_file: Path, worker_id: str, token: Credential | None) -> Credential | None:
    """The credential worker ``worker_id`` joined with before, if it may use it (same token, or none given)."""
    try:
        lines = credential_file.read_text().splitlines()
    except OSError:
        return None
    try:
        credential = Credential.decode(lines[0]) if lines else None
    except ConfigError:
        return None
    via = lines[1].removeprefix("join-token ").strip() if len(lines) > 1 else ""
    if credential is None or not credential.principal.startswith(f"worker:{worker_id}#"):
        return None  # another worker's (a reused workdir): join anew
    if token is not None and via != issued_id(token.principal):
        return None  # a new token: join with it (e.g. after a revocation)
    return credential
