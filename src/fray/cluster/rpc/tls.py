"""TLS for connections that leave the machine: a cluster CA, server certificates, and the rule for using them.

The rule: a connection between two addresses of one machine (loopback) is plain; any
other is TLS, with the server's certificate checked against the *cluster CA* -- a CA made
for this one cluster (:func:`ensure_cluster_tls`), so only servers it signed are trusted.
Both ends apply the same rule from the addresses alone, so they always agree. The Fray
handshake (and, on the controller's protocol, per-frame integrity) runs inside the TLS
channel as before.

Certificates are made with the ``cryptography`` package (``pip install 'fray[tls]'``);
:mod:`ssl` from the standard library does the rest.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
import os
import socket
import ssl
from pathlib import Path

from fray.core._private_files import private_dir, write_private
from fray.errors import AuthenticationError, ConfigError

__all__ = [
    "CA_FILE",
    "CA_RECORDS",
    "CaNotFound",
    "TlsFiles",
    "UntrustedServerError",
    "ca_pin",
    "client_context",
    "default_ca",
    "ensure_cluster_tls",
    "fetch_pinned_ca",
    "forget_ca",
    "is_loopback_address",
    "missing_ca",
    "record_ca",
    "recorded_ca",
    "recorded_controllers",
    "server_context",
]

#: Where a client looks for the cluster CA when ``FRAY_TLS_CA`` is not set and no controller recorded its own.
CA_FILE = Path.home() / ".config" / "fray" / "ca.pem"
#: Where a controller serving TLS records where its CA is, for its user on its machine: a link
#: ``HOST-PORT.pem`` per address to the CA in the controller's ``tls/`` directory (see :func:`record_ca`).
CA_RECORDS = Path.home() / ".config" / "fray" / "cas"


class CaNotFound(ConfigError):
    """A connection beyond this machine needs the cluster's CA, and this machine has none for that address.

    ``hint`` says where the CA is and how to give it.
    """

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


class UntrustedServerError(AuthenticationError):
    """The server's TLS certificate is not signed by the cluster CA: it is not (a server of) this cluster.

    Retrying cannot help, unlike a connection that failed: the client trusts another CA, or
    the address leads to an impostor.
    """


def is_loopback_address(host: str) -> bool:
    """True for addresses that never leave the machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class TlsFiles:
    """The files of one cluster's TLS set-up in ``directory``: CA certificate and key, server certificate and key."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.ca_cert = self.directory / "ca.pem"
        self.ca_key = self.directory / "ca.key"
        self.cert = self.directory / "server.pem"
        self.key = self.directory / "server.key"
        #: The server certificate followed by the CA's: what the server presents, so that a client
        #: holding only the CA's pin can find the CA (see :func:`fetch_pinned_ca`).
        self.chain = self.directory / "chain.pem"

    def exist(self) -> bool:
        return all(p.exists() for p in (self.ca_cert, self.cert, self.key))


def ensure_cluster_tls(directory: str | os.PathLike[str], hosts: list[str]) -> TlsFiles:
    """Make (once) a cluster CA and a server certificate for ``hosts`` in ``directory`` (0700, keys 0600)."""
    files = TlsFiles(directory)
    if files.exist():
        return files
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:  # pragma: no cover - depends on the installation
        raise ConfigError(
            "a controller listening beyond this machine needs TLS certificates, which Fray makes with the "
            "'cryptography' package: pip install 'fray[tls]'"
        ) from None
    private_dir(files.directory)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Fray cluster CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    for host in dict.fromkeys([*hosts, socket.gethostname()]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Fray controller")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    no_password = serialization.NoEncryption()
    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8
    write_private(files.ca_key, ca_key.private_bytes(pem, pkcs8, no_password))
    write_private(files.key, key.private_bytes(pem, pkcs8, no_password))
    write_private(files.cert, cert.public_bytes(pem))
    write_private(files.ca_cert, ca_cert.public_bytes(pem))
    return files


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """The server side: present the controller's certificate and the CA's (TLS 1.2 or later)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    chain = files.cert.read_text() + files.ca_cert.read_text()
    if not files.chain.exists() or files.chain.read_text() != chain:
        write_private(files.chain, chain)
    context.load_cert_chain(files.chain, files.key)
    return context


def ca_pin(ca_pem: str) -> str:
    """The pin of a CA certificate: ``sha256:`` and the hex SHA-256 of its DER bytes."""
    return "sha256:" + hashlib.sha256(ssl.PEM_cert_to_DER_cert(ca_pem)).hexdigest()


def client_context(ca_file: str | os.PathLike[str] | None = None, *, ca_pem: str | None = None) -> ssl.SSLContext:
    """The client side: trust only servers whose certificate the cluster CA (a file, or ``ca_pem``) signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # The CA is this cluster's own: any certificate it signed is the cluster's, whatever
    # address a worker or client reaches it by.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        if ca_pem is not None:
            context.load_verify_locations(cadata=ca_pem)
        else:
            context.load_verify_locations(ca_file)
    except (OSError, ssl.SSLError) as exc:
        # A ConfigError, not an OSError: callers retry OSErrors as connection failures, and a
        # missing or unreadable CA file does not fix itself.
        raise ConfigError(f"cannot use the cluster CA {ca_file or 'of the pin'} (FRAY_TLS_CA): {exc}") from None
    return context


_pinned: dict[tuple[str, int, str], str] = {}


def fetch_pinned_ca(host: str, port: int, pin: str, timeout: float = 5.0) -> str:
    """The CA certificate (PEM) the server at ``host:port`` presents whose pin is ``pin``.

    Only a TLS handshake is exchanged, nothing of Fray's and nothing secret: the CA a server
    presents is public, and the caller then connects again trusting only that CA, which an
    impostor cannot have signed its certificate with. :class:`UntrustedServerError` when no
    certificate the server presents has the pin. Remembered per address and pin.
    """
    known = _pinned.get((host, port, pin))
    if known is not None:
        return known
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.minimum_version = ssl.TLSVersion.TLSv1_2
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE  # the pin decides, on the next connection
    with socket.create_connection((host, port), timeout=timeout) as plain, probe.wrap_socket(plain) as sock:
        for der in _unverified_chain(sock):
            if hmac.compare_digest("sha256:" + hashlib.sha256(der).hexdigest(), pin):
                pem = ssl.DER_cert_to_PEM_cert(der)
                _pinned[(host, port, pin)] = pem
                return pem
    raise UntrustedServerError(
        f"{host}:{port} did not present the CA that the credential pins ({pin[:19]}...): "
        "it is not that cluster's controller"
    )


def _unverified_chain(sock: ssl.SSLSocket) -> list[bytes]:
    """The DER certificates the server presented (Python 3.13 has this in public; 3.11 and 3.12 in ``_sslobj``)."""
    public = getattr(sock, "get_unverified_chain", None)
    if public is not None:
        return [bytes(c) for c in public()]
    certs = sock._sslobj.get_unverified_chain() or []  # type: ignore[attr-defined]
    return [c.public_bytes(ssl._ssl.ENCODING_DER) for c in certs]  # type: ignore[attr-defined]


def _record_of(host: str, port: int | str) -> Path:
    return CA_RECORDS / f"{host.strip('[]')}-{port}.pem"


def record_ca(address: str, ca_file: str | os.PathLike[str]) -> Path | None:
    """Record that the controller at ``address`` (``host:port``) has its CA at ``ca_file``; return the record.

    The record is a link in :data:`CA_RECORDS`, so that every ``fray`` command (and every client)
    of this user on this machine finds the CA of the controller it is pointed at without
    ``FRAY_TLS_CA``. Records whose CA is gone (a cluster directory deleted) are dropped on the
    way. Best effort: None when the home directory cannot be written.
    """
    host, _, port = address.rpartition(":")
    record = _record_of(host, port)
    try:
        private_dir(CA_RECORDS)
        for old in CA_RECORDS.glob("*.pem"):
            if old.is_symlink() and not old.exists():
                old.unlink(missing_ok=True)
        tmp = record.with_name(f".{record.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(Path(ca_file).resolve())
        tmp.replace(record)
    except OSError:
        return None
    return record


def forget_ca(address: str, ca_file: str | os.PathLike[str]) -> None:
    """Drop the record of ``address`` if it still names ``ca_file`` (a controller that stops)."""
    host, _, port = address.rpartition(":")
    record = _record_of(host, port)
    try:
        if record.is_symlink() and Path(os.readlink(record)) == Path(ca_file).resolve():
            record.unlink()
    except OSError:
        pass


def recorded_ca(host: str, port: int) -> Path | None:
    """The CA the controller at ``host:port`` recorded for this user (:func:`record_ca`), if it still exists."""
    record = _record_of(host, port)
    return record if record.exists() else None


def recorded_controllers(port: int | None = None) -> list[str]:
    """The addresses (``host:port``) of the controllers that recorded their CA here (on ``port``, if given)."""
    found = []
    for record in sorted(CA_RECORDS.glob("*.pem")) if CA_RECORDS.is_dir() else []:
        host, _, number = record.name.removesuffix(".pem").rpartition("-")
        if record.exists() and number.isdigit() and (port is None or int(number) == port):
            found.append(f"[{host}]:{number}" if ":" in host else f"{host}:{number}")
    return found


def default_ca(host: str | None = None, port: int | None = None) -> Path | None:
    """The CA to trust for ``host:port``: ``FRAY_TLS_CA``, else the one its controller recorded here, else
    ``~/.config/fray/ca.pem`` if it exists, else None."""
    configured = os.environ.get("FRAY_TLS_CA")
    if configured:
        return Path(configured)
    if host is not None and port is not None:
        recorded = recorded_ca(host, port)
        if recorded is not None:
            return recorded
    return CA_FILE if CA_FILE.exists() else None


def missing_ca(host: str, port: int) -> CaNotFound:
    """The error for a connection to ``host:port`` (beyond this machine) without a CA to check it with."""
    return CaNotFound(
        f"{host}:{port} is not on this machine, so the connection must use TLS, and there is no CA of its cluster "
        f"here: FRAY_TLS_CA is not set, and no controller at {host}:{port} recorded its CA in {CA_RECORDS}",
        "the controller makes its CA in tls/ beside its database (`fray controller` prints the path when it "
        "starts) and records it for the user who started it, so that user's `fray` commands on the controller's "
        "machine find it; elsewhere, set FRAY_TLS_CA to a copy of that ca.pem, or use a credential that pins it "
        "(FRAY_CREDENTIAL: the line `fray token create --role user:NAME` prints on the controller's machine)",
    )
