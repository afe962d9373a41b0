"""Who is calling: the credentials of a Fray cluster and the principals they prove.

Every key is derived from the cluster token (the *master*), so the controller checks any
credential without storing it: ``key = HMAC-SHA256(master, "fray-credential:" + principal)``.
The principals are:

* ``""`` -- the cluster token itself: the administrator (``fray cluster up``'s owner);
* ``"worker"`` -- the worker credential: may register workers and report tasks, nothing else;
* ``"user:NAME"`` -- a user: jobs it submits belong to NAME, and only NAME (or the
  administrator) may stop them;
* ``"job:ID"`` -- a running job's own credential, handed to its tasks instead of the
  cluster token: it acts for the job's user, submits only children of that job, and
  stops working when the job ends.

Actor servers in tasks authenticate with a *namespace key* (``namespace:NAME``), so a
task's environment never holds a key that reaches beyond its own namespace's actors.

A credential is written as one line ``fray-credential-v1 PRINCIPAL HEXKEY`` (files are
created 0600), and read from ``FRAY_CREDENTIAL``, else ``FRAY_TOKEN`` (the cluster
token), else ``~/.config/fray/credential``, else ``~/.config/fray/token``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fray._private_files import write_private
from fray.errors import ConfigError

__all__ = [
    "ADMIN",
    "WORKER",
    "ClusterKeys",
    "Credential",
    "derive_key",
    "job_principal",
    "load_credential",
    "namespace_principal",
    "user_principal",
    "write_credential",
]

ADMIN = ""
WORKER = "worker"
_MAGIC = "fray-credential-v1"
_CONFIG = Path.home() / ".config" / "fray"


def user_principal(user: str) -> str:
    return f"user:{user}"


def job_principal(job_id: str) -> str:
    return f"job:{job_id}"


def namespace_principal(namespace: str) -> str:
    return f"namespace:{namespace}"


def derive_key(master: bytes, principal: str) -> bytes:
    """The key of ``principal`` in the cluster whose token is ``master``."""
    return hmac.new(master, b"fray-credential:" + principal.encode(), hashlib.sha256).digest()


@dataclass(frozen=True)
class Credential:
    """A principal and the key that proves it (``principal == ""``: the cluster token)."""

    principal: str
    key: bytes

    @classmethod
    def mint(cls, master: bytes, principal: str) -> Credential:
        """The credential of ``principal`` (only the holder of the cluster token can make one)."""
        return cls(principal, derive_key(master, principal))

    def encode(self) -> str:
        """The one-line form, for ``FRAY_CREDENTIAL`` or a credential file."""
        return f"{_MAGIC} {self.principal or '-'} {self.key.hex()}"

    @classmethod
    def decode(cls, text: str) -> Credential:
        """Parse :meth:`encode`'s form; ConfigError if it is not one."""
        parts = text.strip().split(" ")
        if len(parts) != 3 or parts[0] != _MAGIC:
            raise ConfigError(f"not a Fray credential (expected '{_MAGIC} PRINCIPAL HEXKEY'): {text[:40]!r}...")
        try:
            key = bytes.fromhex(parts[2])
        except ValueError:
            raise ConfigError("a Fray credential's key must be hexadecimal") from None
        return cls("" if parts[1] == "-" else parts[1], key)

    def __repr__(self) -> str:  # never print the key
        return f"Credential({self.principal or '<cluster token>'!r})"


class ClusterKeys:
    """The controller's side: the key each principal must prove, from the cluster token ``master``.

    ``job_is_live(job_id)`` says whether a job's credential is still valid (it dies with the job).
    """

    def __init__(self, master: bytes | None, job_is_live: Callable[[str], bool]) -> None:
        self._master = master
        self._job_is_live = job_is_live

    def key_for(self, principal: str) -> bytes | None:
        """The key a connection claiming ``principal`` must prove (None: refused)."""
        if self._master is None:
            return None
        if principal == ADMIN:
            return self._master
        if principal == WORKER or principal.startswith("user:"):
            return derive_key(self._master, principal)
        if principal.startswith("job:") and self._job_is_live(principal.removeprefix("job:")):
            return derive_key(self._master, principal)
        return None

    def job_credential(self, job_id: str) -> str:
        """The encoded credential a job's tasks get ("" without a master)."""
        return "" if self._master is None else Credential.mint(self._master, job_principal(job_id)).encode()

    def namespace_token(self, namespace: str) -> str:
        """The key actor servers and clients of ``namespace`` authenticate with (hex; "" without a master)."""
        return "" if self._master is None else derive_key(self._master, namespace_principal(namespace)).hex()


def load_credential(token: str | bytes | None = None) -> Credential | None:
    """The credential to use: ``token`` (the cluster token) if given, else the environment, else the files."""
    if token is not None:
        return Credential(ADMIN, token.encode() if isinstance(token, str) else token)
    if os.environ.get("FRAY_CREDENTIAL"):
        return Credential.decode(os.environ["FRAY_CREDENTIAL"])
    if os.environ.get("FRAY_TOKEN"):
        return Credential(ADMIN, os.environ["FRAY_TOKEN"].encode())
    for name in ("credential", "token"):
        try:
            text = (_CONFIG / name).read_text().strip()
        except OSError:
            continue
        if text:
            return Credential.decode(text) if name == "credential" else Credential(ADMIN, text.encode())
    return None


def write_credential(path: Path, credential: Credential) -> None:
    """Write ``credential`` to ``path``, readable by its owner only (0600, directory 0700)."""
    write_private(path, credential.encode() + "\n")
