"""The worker's keep-alive: short, frequent contact attempts while the link to the controller is quiet.

A worker's tasks may run only up to its lease (0.75 x the worker timeout) after the controller
last answered it (see :mod:`fray.cluster.server.worker`). If the last answer can be a whole
heartbeat older than a network cut, and the one call that would renew it can hang for its whole
timeout (a request sent into a dead link is retransmitted by TCP with exponential back-off, so it
may arrive seconds after the link is back), then a blip well under the timeout lapses the lease and
the worker stops every task. :class:`KeepAlive` removes both delays:

* whenever nothing has answered for :data:`QUIET_FRACTION` of the lease (lease/16), it sends one
  small heartbeat (an empty report), so the last contact is at most that old when a cut starts;
* every attempt runs in its own short-lived thread, with a per-call timeout of a quarter of the
  lease, and the next attempt is launched on time whatever the earlier ones are doing -- while
  they fail, every :data:`RETRY_FRACTION` of the lease (lease/32) -- so a stuck call never
  delays the next one, and the first attempt after the link heals (a fresh connection: a new SYN,
  not a retransmission backed off for seconds) renews the lease within lease/32 of the heal.

So a worker cut off for a time ``c`` last heard from the controller at most
``c + lease/16 + lease/32`` (plus a round trip) ago when contact comes back: with ``c`` = 60 % of
the timeout that is 0.67 x the timeout, inside the 0.75 lease. A cut longer than the lease still
lapses it, exactly as before (the fork server stops the tasks before the controller can replace them).

The keep-alive carries nothing but the worker's epoch and health note, so it needs no session
with the report loop: a keep-alive of an epoch that has just ended is refused and changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["MAX_IN_FLIGHT", "QUIET_FRACTION", "RETRY_FRACTION", "KeepAlive"]

logger = logging.getLogger(__name__)

#: A heartbeat goes out when nothing has answered for this fraction of the lease.
QUIET_FRACTION = 1 / 16
#: While attempts go unanswered, a new one starts this often (a fraction of the lease).
RETRY_FRACTION = 1 / 32
#: Each attempt gives up after this fraction of the lease (the next ones do not wait for it).
CALL_FRACTION = 1 / 4
#: At most this many attempts in flight at once (a long cut: each ends at its own timeout).
MAX_IN_FLIGHT = 12


class KeepAlive:
    """Sends ``beat(timeout)`` whenever the worker's last contact is older than lease/16 (see the module).

    ``lease()`` is the worker's lease in seconds (0 while it has none: not registered yet);
    ``last_contact()`` is when the controller last answered (monotonic, the send time of the
    answered request); ``beat(timeout)`` sends one heartbeat limited to ``timeout`` seconds and
    records the contact itself if it is answered. Exceptions of ``beat`` are expected (the link is
    down) and only logged at debug level.
    """

    def __init__(
        self,
        *,
        beat: Callable[[float], None],
        lease: Callable[[], float],
        last_contact: Callable[[], float],
        stopping: threading.Event,
        name: str = "fray-worker-keepalive",
    ) -> None:
        self._beat = beat
        self._lease = lease
        self._last_contact = last_contact
        self._stopping = stopping
        self._name = name
        self._lock = threading.Lock()
        self._in_flight = 0
        #: How many attempts were started and how many failed (for tests and logs).
        self.attempts = 0
        self.failures = 0
        self._thread: threading.Thread | None = None

    def start(self) -> threading.Thread:
        """Run the keep-alive in a background thread until ``stopping`` is set; returns that thread.

        Attempts still in flight when it ends finish at their own timeouts.
        """
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self._thread

    def _run(self) -> None:
        while not self._stopping.is_set():
            lease = self._lease()
            if lease <= 0:
                self._stopping.wait(0.1)
                continue
            quiet, retry = lease * QUIET_FRACTION, lease * RETRY_FRACTION
            age = time.monotonic() - self._last_contact()
            if age >= quiet:
                self._launch(lease * CALL_FRACTION)
                # Unanswered for longer than a quiet period already: the attempt just started may be
                # lost in a dead link; the next one goes out a retry period later, whatever it does.
                self._stopping.wait(retry)
            else:
                self._stopping.wait(max(quiet - age, retry))

    def _launch(self, timeout: float) -> None:
        with self._lock:
            if self._in_flight >= MAX_IN_FLIGHT:
                return
            self._in_flight += 1
            self.attempts += 1
        threading.Thread(target=self._attempt, args=(timeout,), name=f"{self._name}-call", daemon=True).start()

    def _attempt(self, timeout: float) -> None:
        try:
            self._beat(timeout)
        except Exception as exc:  # the link is down, or the controller busy: the next attempt is on its way
            with self._lock:
                self.failures += 1
            logger.debug("keep-alive failed (%s: %s)", type(exc).__name__, exc)
        finally:
            with self._lock:
                self._in_flight -= 1
