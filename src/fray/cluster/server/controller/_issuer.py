"""The credentials the controller issues: join tokens, workers' and users' own, and their revocation.

Every credential derives from the cluster token (:class:`~fray.cluster.protocol.credentials.ClusterKeys`);
an issued one must also be on record in the store, valid. :class:`CredentialIssuer` keeps
that record in memory for the handshakes and calls that check it, and is what
:class:`~fray.cluster.server.controller.ControllerService`'s credential methods call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fray.cluster.protocol.credentials import ClusterKeys, Issued, new_credential_id
from fray.cluster.server.store import ClusterStore
from fray.errors import ConfigError, PermissionDenied

__all__ = ["DEFAULT_JOIN_TTL", "CredentialIssuer"]

logger = logging.getLogger("fray.cluster.server.controller")

#: How long a worker join token lasts unless told (``fray token create --ttl``): a day, as kubeadm's.
DEFAULT_JOIN_TTL = 86400.0


def _plain_name(name: str) -> bool:
    """A worker id or user name that is safe in a principal and a file name: letters, digits, ``._-``."""
    return bool(name) and len(name) <= 128 and all(c.isalnum() or c in "._-" for c in name)


class CredentialIssuer:
    """Issues, lists and revokes the controller's credentials; :attr:`keys` checks them.

    ``master`` is the cluster token; ``pin`` the pin of the cluster CA when the controller
    serves TLS, written into the credentials it issues. ``job_is_live`` tells whether a job's
    own credential still works.
    """

    def __init__(
        self,
        store: ClusterStore,
        master: bytes | None,
        job_is_live: Callable[[str], bool],
        clock: Callable[[], float],
        pin: str,
    ) -> None:
        self._store = store
        self._clock = clock
        self.pin = pin
        # Issued credentials by id (join tokens, workers' and users' own): replaced whole on every change,
        # read without a lock by every handshake and call.
        self._issued: dict[str, Issued] = {r.credential_id: r for r in store.issued()}
        # Every credential derives from the cluster token; issued ones must also be on record, valid.
        self.keys = ClusterKeys(master, job_is_live, lambda cid: self._issued.get(cid), clock)

    def create_token(self, role: str, ttl: float | None = None) -> tuple[Issued, str]:
        """Issue a join token (``role="worker"``) or a user credential (``role="user:NAME"``); its record and line.

        ``ttl`` (seconds) bounds its life: a join token lasts :data:`DEFAULT_JOIN_TTL` unless told, a
        user credential for ever. The line names the CA's pin when the controller serves TLS.
        """
        if role == "worker":
            subject = "join"
            ttl = DEFAULT_JOIN_TTL if ttl is None else ttl
        elif role.startswith("user:") and _plain_name(role.removeprefix("user:")):
            subject = role
        else:
            raise ConfigError(f"--role {role!r}: a token is for 'worker' (a join token) or 'user:NAME'")
        if ttl is not None and not ttl > 0:
            raise ConfigError(f"--ttl {ttl:g}: a token's life must be a positive number of seconds")
        now = self._clock()
        record = Issued(new_credential_id(), subject, now, None if ttl is None else now + ttl)
        return record, self._record(record)

    def join(self, token_principal: str, worker_id: str) -> str:
        """Exchange the join token the caller proved for ``worker_id``'s own credential (its line).

        A worker that was revoked joins again only with a token made after its revocation.
        """
        token = self.keys.issued_record(token_principal)
        if token is None or token.subject != "join" or not token.valid(self._clock()):
            raise PermissionDenied("this join token is not valid (expired, revoked or unknown)")
        if not _plain_name(worker_id):
            raise ConfigError(f"worker id {worker_id!r}: use letters, digits and . _ - only")
        revoked = [r.revoked_at for r in self._issued.values() if r.subject == f"worker:{worker_id}" and r.revoked_at]
        if revoked and max(revoked) >= token.created_at:
            raise PermissionDenied(
                f"worker {worker_id} was revoked after this join token was made: it joins again only with a new "
                "token (fray token create --role worker)"
            )
        record = Issued(new_credential_id(), f"worker:{worker_id}", self._clock(), via=token.credential_id)
        logger.info("worker %s joined with token %s", worker_id, token.credential_id)
        return self._record(record)

    def _record(self, record: Issued) -> str:
        line = self.keys.issue(record, self.pin).encode()
        self._store.add_issued(record)
        self.reload()
        return line

    def reload(self) -> None:
        """Read the issued credentials from the store again (after a revocation the store made)."""
        self._issued = {r.credential_id: r for r in self._store.issued()}

    def list(self) -> list[Issued]:
        """Every issued credential and join token (none of their keys)."""
        return list(self._issued.values())

    def revoke(self, credential_id: str) -> bool:
        """Revoke one issued credential or join token: it stops working at once (False: it was already)."""
        revoked = self._store.revoke_issued(credential_id, self._clock())
        self.reload()
        return revoked
