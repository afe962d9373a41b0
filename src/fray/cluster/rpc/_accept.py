"""Accepting connections under limits: the accept loop every Fray server shares.

:class:`Acceptor` owns a listening socket and hands each connection, once it has
completed the handshake, to the server's ``serve`` function in its own thread. What it
protects against, before any peer is authenticated:

* a peer that connects and then trickles or withholds its handshake: the whole handshake
  must finish within :data:`~fray.cluster.rpc.wire.HANDSHAKE_TIMEOUT`, and at most
  ``max_handshakes`` handshakes run at once -- past that the *oldest* is dropped, so a
  flood of slow connections costs a legitimate client (whose handshake takes a
  millisecond) almost nothing;
* too many connections: at most ``max_connections`` authenticated ones in total and
  ``max_per_peer`` from one address (the excess is closed with a log line);
* eavesdroppers and meddlers beyond this machine: with a TLS context, every peer that is
  not on a loopback address must speak TLS before the Fray handshake (see :mod:`fray.cluster.rpc.tls`);
* running out of file descriptors: ``accept()`` failing with EMFILE/ENFILE makes the
  loop log it (once per episode), drop the oldest handshake and back off, instead of
  spinning on a listener that stays readable.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable

from fray.cluster.rpc import wire
from fray.cluster.rpc.tls import is_loopback_address

__all__ = ["Acceptor", "Limits"]

logger = logging.getLogger(__name__)

_FD_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Seconds without running out of descriptors after which an episode counts as over.
_RECOVERED_AFTER = 30.0


class Limits:
    """How many connections a server accepts (see :class:`Acceptor`)."""

    def __init__(self, max_connections: int = 4096, max_per_peer: int = 1024, max_handshakes: int = 64) -> None:
        self.max_connections = max_connections
        self.max_per_peer = max_per_peer
        self.max_handshakes = max_handshakes


class Acceptor:
    """Accepts connections on ``listener``, authenticates them, and serves each in its own thread.

    ``keys`` is what the handshake checks proofs against (see
    :func:`~fray.cluster.rpc.wire.server_handshake`). ``serve(sock, peer, authenticated)`` runs after a
    successful handshake, with the principal and session key it established, and owns the socket until it
    returns (the acceptor closes it afterwards).
    """

    def __init__(
        self,
        listener: socket.socket,
        keys: wire.KeySource,
        serve: Callable[[socket.socket, str, wire.Authenticated], None],
        *,
        limits: Limits | None = None,
        name: str = "fray",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._listener = listener
        self._tls = tls
        self._keys = keys
        self._serve = serve
        self._limits = limits or Limits()
        self._name = name
        self._lock = threading.Lock()
        self._handshaking: collections.OrderedDict[socket.socket, float] = collections.OrderedDict()
        self._established: dict[str, int] = {}
        self._total = 0
        self._stopped = threading.Event()
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        self._sockets: set[socket.socket] = set()

    def start(self) -> None:
        # The selector is made here, so that a failure to make it is the caller's error, not a dead thread.
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        selector.register(self._wakeup_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._loop, args=(selector,), name=f"{self._name}-accept", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting and close every connection."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._wakeup_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._wakeup_r.close()
        self._wakeup_w.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)

    def _loop(self, selector: selectors.BaseSelector) -> None:
        backoff = 0.0
        starved_since = 0.0  # when accept() last failed for lack of descriptors (0: not starved)
        with selector:
            while not self._stopped.is_set():
                # Out of descriptors: wait for some to be freed rather than spin.
                if backoff and self._stopped.wait(backoff):
                    return
                events = selector.select()
                if any(key.fileobj is self._wakeup_r for key, _ in events):
                    return
                try:
                    sock, address = self._listener.accept()
                except OSError as exc:
                    if exc.errno in _FD_ERRORS:
                        if not starved_since:
                            logger.error(
                                "%s server cannot accept connections: %s; dropping the oldest unauthenticated "
                                "connection and backing off",
                                self._name,
                                exc,
                            )
                        starved_since = time.monotonic()
                        self._evict_oldest()
                        backoff = min(max(backoff * 2, 0.05), 1.0)
                    logger.warning("%s server: accept() failed: %s", self._name, exc)
                    continue
                backoff = 0.0
                if starved_since and time.monotonic() - starved_since > _RECOVERED_AFTER:
                    # One episode is one log line: only a quiet spell ends it.
                    logger.warning("%s server accepts connections again", self._name)
                    starved_since = 0.0
                peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
                host = address[0] if isinstance(address, tuple) else str(address)
                try:
                    self._admit(sock, peer, host)
                except Exception:  # the loop must outlive any one connection
                    logger.exception("%s server: could not take the connection from %s", self._name, peer)
                    sock.close()

    def _admit(self, sock: socket.socket, peer: str, host: str) -> None:
        with self._lock:
            if self._stopped.is_set():
                sock.close()
                return
            self._handshaking[sock] = time.monotonic()
            self._sockets.add(sock)
            evict = len(self._handshaking) > self._limits.max_handshakes
        if evict:
            self._evict_oldest()
        try:
            threading.Thread(target=self._run, args=(sock, peer, host), name=f"{self._name}-conn", daemon=True).start()
        except RuntimeError:  # cannot start a thread: drop this connection, keep the server
            self._forget(sock)
            sock.close()

    def _start_tls(self, plain: socket.socket) -> socket.socket:
        """Run the TLS handshake (within the handshake deadline); the TLS socket replaces the plain one."""
        deadline = time.monotonic() + wire.HANDSHAKE_TIMEOUT
        with self._lock:
            self._handshaking.pop(plain, None)
            self._sockets.discard(plain)
        assert self._tls is not None
        secure = self._tls.wrap_socket(plain, server_side=True, do_handshake_on_connect=False)
        with self._lock:
            self._handshaking[secure] = time.monotonic()
            self._sockets.add(secure)
        try:
            secure.settimeout(wire.HANDSHAKE_TIMEOUT)
            secure.do_handshake()
            if time.monotonic() > deadline:
                raise TimeoutError("the TLS handshake took too long")
        except BaseException:
            # The plain socket was handed over to the TLS one: close that, or the peer hangs on.
            self._forget(secure)
            _shutdown(secure)
            secure.close()
            raise
        return secure

    def _evict_oldest(self) -> None:
        with self._lock:
            if not self._handshaking:
                return
            oldest, _ = self._handshaking.popitem(last=False)
        _shutdown(oldest)

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._handshaking.pop(sock, None)
            self._sockets.discard(sock)

    def _run(self, sock: socket.socket, peer: str, host: str) -> None:
        counted = False
        try:
            wire.tune_socket(sock)
            if self._tls is not None and not is_loopback_address(host):
                sock = self._start_tls(sock)
            peer_auth = wire.server_handshake(sock, self._keys, time.monotonic() + wire.HANDSHAKE_TIMEOUT)
            if peer_auth is None:
                logger.warning("refused connection from %s: authentication failed", peer)
                return
            sock.settimeout(None)
            with self._lock:
                if self._handshaking.pop(sock, None) is None:
                    return  # evicted meanwhile
                over = self._total >= self._limits.max_connections
                over_peer = self._established.get(host, 0) >= self._limits.max_per_peer
                if not over and not over_peer:
                    self._total += 1
                    self._established[host] = self._established.get(host, 0) + 1
                    counted = True
            if not counted:
                which = (
                    f"{self._limits.max_connections} in total" if over else f"{self._limits.max_per_peer} from {host}"
                )
                logger.warning("refused connection from %s: too many connections (at most %s)", peer, which)
                return
            self._serve(sock, peer, peer_auth)
        except (OSError, ValueError):
            return  # a reset, the handshake deadline, or a socket closed by stop() or eviction
        except Exception:
            logger.exception("dropping connection from %s after an internal error", peer)
        finally:
            if counted:
                with self._lock:
                    self._total -= 1
                    left = self._established.get(host, 1) - 1
                    if left:
                        self._established[host] = left
                    else:
                        self._established.pop(host, None)
            self._forget(sock)
            _shutdown(sock)
            sock.close()


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
