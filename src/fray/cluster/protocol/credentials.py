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

*Issued* credentials are recorded by the controller when it makes them, so they can expire
and be revoked (see :class:`Issued`); their principal names the record after a ``#``:

* ``"join:ID"`` -- a join token (``fray token create --role worker``): it may only exchange
  itself for a worker's own credential (:meth:`ControllerService.join`);
* ``"worker:WORKER#ID"`` -- one worker's own credential: it registers, polls and reports as
  WORKER only;
* ``"user:NAME#ID"`` -- a user credential that can expire and be revoked.

An issued credential's line may end with the *pin* of the controller's CA
(``sha256:HEX``, see :func:`fray.cluster.rpc.tls.ca_pin`): a client that has no CA file checks the
controller against it before sending anything secret.

Actor servers in tasks authenticate with a *namespace key* (``namespace:NAME``), so a
task's environment never holds a key that reaches beyond its own namespace's actors.

A credential is written as one line ``fray-credential-v1 PRINCIPAL HEXKEY [PIN]`` (files are
created 0600), and read from ``FRAY_CREDENTIAL``, else ``FRAY_TOKEN`` (the cluster
token), else ``~/.config/fray/credential``, else ``~/.config/fray/token``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fray.core._private_files import write_private
from fray.errors import ConfigError

__all__ = [
    "ADMIN",
    "WORKER",
    "ClusterKeys",
    "Credential",
    "Issued",
    "derive_key",
    "issued_id",
    "issued_principal",
    "job_principal",
    "load_credential",
    "namespace_principal",
    "new_credential_id",
    "user_principal",
    "write_credential",
]

ADMIN = ""
WORKER = "worker"
_MAGIC = "fray-credential-v1"
_PIN = re.compile(r"sha256:[0-9a-f]{64}")
_CONFIG = Path.home() / ".config" / "fray"


def user_principal(user: str) -> str:
    return f"user:{user}"


def job_principal(job_id: str) -> str:
    return f"job:{job_id}"


def namespace_principal(namespace: str) -> str:
    return f"namespace:{namespace}"


def new_credential_id() -> str:
    """A fresh id for an issued credential or join token (short, random, safe in a principal)."""
    return secrets.token_hex(6)


def issued_principal(subject: str, credential_id: str) -> str:
    """The principal of an issued credential: ``join:ID`` for a join token, else ``SUBJECT#ID``."""
    return f"join:{credential_id}" if subject == "join" else f"{subject}#{credential_id}"


def issued_id(principal: str) -> str | None:
    """The record id of an issued credential's principal (None: not an issued one)."""
    if principal.startswith("join:"):
        return principal.removeprefix("join:") or None
    if not principal.startswith(("worker:", "user:")):
        return None
    _, sep, credential_id = principal.rpartition("#")
    return credential_id if sep and credential_id else None


@dataclass(frozen=True)
class Issued:
    """The controller's record of an issued credential: a join token, a worker's or a user's own.

    ``subject`` is ``"join"`` (a join token for workers), ``"worker:ID"`` or ``"user:NAME"``;
    ``via`` is the join token a worker's credential was exchanged for. Times are Unix seconds;
    ``expires_at`` None never expires, ``revoked_at`` None is not revoked.
    """

    credential_id: str
    subject: str
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    via: str = ""

    @property
    def principal(self) -> str:
        return issued_principal(self.subject, self.credential_id)

    def valid(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def state(self, now: float) -> str:
        """``valid``, ``expired`` or ``revoked``."""
        if self.revoked_at is not None:
            return "revoked"
        return "valid" if self.valid(now) else "expired"


def derive_key(master: bytes, principal: str) -> bytes:
    """The key of ``principal`` in the cluster whose token is ``master``."""
    return hmac.new(master, b"fray-credential:" + principal.encode(), hashlib.sha256).digest()


@dataclass(frozen=True)
class Credential:
    """A principal and the key that proves it (``principal == ""``: the cluster token).

    ``pin`` (``sha256:HEX``, or "") is the controller's CA as an issued credential names it.
    """

    principal: str
    key: bytes
    pin: str = ""

    @classmethod
    def mint(cls, master: bytes, principal: str) -> Credential:
        """The credential of ``principal`` (only the holder of the cluster token can make one)."""
        return cls(principal, derive_key(master, principal))

    def encode(self) -> str:
        """The one-line form, for ``FRAY_CREDENTIAL`` or a credential file."""
        line = f"{_MAGIC} {self.principal or '-'} {self.key.hex()}"
        return f"{line} {self.pin}" if self.pin else line

    @classmethod
    def decode(cls, text: str) -> Credential:
        """Parse :meth:`encode`'s form; ConfigError if it is not one."""
        parts = text.strip().split(" ")
        if len(parts) not in (3, 4) or parts[0] != _MAGIC:
            raise ConfigError(
                f"not a Fray credential (expected '{_MAGIC} PRINCIPAL HEXKEY [PIN]'): {text.strip()[:40]!r}..."
            )
        try:
            key = bytes.fromhex(parts[2])
        except ValueError:
            raise ConfigError("a Fray credential's key must be hexadecimal") from None
        pin = parts[3] if len(parts) == 4 else ""
        if pin and not _PIN.fullmatch(pin):
            raise ConfigError(f"a Fray credential's CA pin must be sha256:<64 hex digits>, not {pin[:20]!r}")
        return cls("" if parts[1] == "-" else parts[1], key, pin)

    def __repr__(self) -> str:  # never print the key
        return f"Credential({self.principal or '<cluster token>'!r})"


class ClusterKeys:
    """The controller's side: the key each principal must prove, from the cluster token ``master``.

    ``job_is_live(job_id)`` says whether a job's credential is still valid (it dies with the job);
    ``issued(id)`` is the record of an issued credential (None: unknown), and ``clock`` the time
    its expiry is checked against.
    """

    def __init__(
        self,
        master: bytes | None,
        job_is_live: Callable[[str], bool],
        issued: Callable[[str], Issued | None] = lambda _id: None,
        clock: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._master = master
        self._job_is_live = job_is_live
        self._issued = issued
        self._clock = clock

    def issued_record(self, principal: str) -> Issued | None:
        """The record behind an issued principal, if it is one that record was made for."""
        credential_id = issued_id(principal)
        record = self._issued(credential_id) if credential_id is not None else None
        return record if record is not None and record.principal == principal else None

    def valid(self, principal: str) -> bool:
        """False for an issued credential that was revoked or has expired since (checked on every call)."""
        return self.state(principal) == "valid"

    def state(self, principal: str) -> str:
        """``valid``, ``revoked``, ``expired``, or ``unknown`` (an issued credential not on record)."""
        if issued_id(principal) is None:
            return "valid"
        record = self.issued_record(principal)
        return record.state(self._clock()) if record is not None else "unknown"

    def key_for(self, principal: str) -> bytes | None:
        """The key a connection claiming ``principal`` must prove (None: refused).

        An issued credential on record gets its key even once revoked or expired: the connection
        proves it holds it, and then every call is refused saying which (``revoked``, ``expired``)
        -- never anything more (see :mod:`fray.cluster.server.controller._api`).
        """
        if self._master is None:
            return None
        if principal == ADMIN:
            return self._master
        if issued_id(principal) is not None:
            return derive_key(self._master, principal) if self.issued_record(principal) is not None else None
        if principal == WORKER or principal.startswith("user:"):
            return derive_key(self._master, principal)
        if principal.startswith("job:") and self._job_is_live(principal.removeprefix("job:")):
            return derive_key(self._master, principal)
        return None

    def issue(self, record: Issued, pin: str = "") -> Credential:
        """The credential of an issued ``record`` (which the caller stores), naming the CA ``pin``."""
        if self._master is None:
            raise ConfigError("a controller without a cluster token issues no credentials")
        return Credential(record.principal, derive_key(self._master, record.principal), pin)

    def job_credential(self, job_id: str, pin: str = "") -> str:
        """The encoded credential a job's tasks get, naming the CA ``pin`` ("" without a master)."""
        if self._master is None:
            return ""
        principal = job_principal(job_id)
        return Credential(principal, derive_key(self._master, principal), pin).encode()

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
