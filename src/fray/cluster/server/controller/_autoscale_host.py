"""The autoscaler inside the controller: its own thread, what it reads of the controller, what it tells it.

:class:`AutoscaleHost` runs :meth:`Autoscaler.tick <fray.cluster.server.autoscale.autoscaler.Autoscaler.tick>`
every :data:`TICK_SECONDS` and soon after demand changes, on a thread of its own: provider
calls (which may take seconds on a cloud) never hold up a scheduling pass. After each tick
it hands the controller the workers to place nothing new on (VMs booting or draining) and
the autoscaler's pending reasons, which the next scheduling pass writes in place of the
scheduler's own for the jobs it cannot place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fray.cluster.protocol.records import WorkerState
from fray.cluster.server.autoscale.autoscaler import Autoscaler, ClusterView
from fray.cluster.server.autoscale.config import ClusterConfig
from fray.cluster.server.autoscale.provider import Provider
from fray.cluster.server.controller._service import ControllerService
from fray.cluster.server.scheduler import PendingReason, SchedulingDecision
from fray.cluster.server.store import ClusterStore
from fray.errors import ConfigError, NotFound

if TYPE_CHECKING:
    from fray.cluster.server.controller._controller import Controller
__all__ = ["TICK_SECONDS", "AutoscaleHost", "start_autoscaling"]

logger = logging.getLogger(__name__)

#: Seconds between ticks when nothing asks for one sooner.
TICK_SECONDS = 2.0
# New demand wakes the autoscaler at most this often (a burst of submits is one tick).
_KICK_SECONDS = 0.5


class AutoscaleHost:
    """Runs an :class:`Autoscaler` for a controller (see the module docstring); the ops API calls it too."""

    def __init__(
        self, service: ControllerService, store: ClusterStore, autoscaler: Autoscaler, *, interval: float = TICK_SECONDS
    ) -> None:
        self.autoscaler = autoscaler
        self._service = service
        self._store = store
        self._interval = interval
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._notes: Mapping[str, str] = {}
        self._last_pending: Mapping[str, PendingReason] | None = None
        self._pass_fenced: frozenset[str] = frozenset()  # the fences the last scheduling pass used
        self._last_kick = 0.0

    # ----- lifecycle ----------------------------------------------------------------------------

    def start(self) -> AutoscaleHost:
        """Hook into the controller and start ticking."""
        self._service.pending_notes = self._annotate
        self._thread = threading.Thread(target=self._loop, name="fray-autoscaler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop ticking (the VMs stay as they are) and release the provider."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._service.pending_notes = None
        self.autoscaler.provider.close()

    def kick(self) -> None:
        """Tick soon (demand changed, or a fault was injected)."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick_once()
            except Exception:  # the loop must survive anything one tick hits
                logger.exception("autoscaler tick failed")
            self._wake.wait(self._interval)
            self._wake.clear()

    def tick_once(self) -> None:
        """Read the controller, tick, and hand the controller the fences and pending reasons."""
        result = self.autoscaler.tick(self._view())
        self._notes = result.notes
        if result.fenced != self._service.fenced_workers:
            self._service.fenced_workers = result.fenced

    def _view(self) -> ClusterView:
        registered: set[str] = set()
        lost: set[str] = set()
        for record in self._store.list_workers():
            if record.state == WorkerState.ALIVE:
                registered.add(record.info.worker_id)
            else:
                lost.add(record.info.worker_id)
        # Read after the registrations: a worker that registers between the two reads is then in both.
        # The other order once made a slice READY whose worker the dry run did not have, and its job,
        # unplaceable there, asked for a second VM the moment the first was ready.
        snapshot = self._store.scheduler_input(pending=False)
        pending = self._service.pending_snapshot()
        last = self._last_pending
        if self._pass_fenced is not self._service.fenced_workers:
            last = None  # that pass saw other fences (a slice became READY since): a dry run of its own
        return ClusterView(
            pending=pending,
            # The last scheduling pass's unplaced jobs are the demand (a second dry run would cost as much
            # as the pass, every tick, on the scheduler's GIL); jobs newer than that pass wait for the next.
            unplaced=[job for job in pending if job.job_id in last] if last is not None else None,
            workers=snapshot.workers,
            running=snapshot.running,
            credits=snapshot.credits,
            registered=frozenset(registered),
            lost=frozenset(lost),
        )

    # ----- the scheduling pass's hook -----------------------------------------------------------

    def _annotate(self, decision: SchedulingDecision) -> SchedulingDecision:
        """Put the autoscaler's reasons on the jobs the pass left pending; wake it for jobs it has not seen."""
        notes = self._notes
        self._last_pending = decision.pending
        self._pass_fenced = self._service.fenced_workers
        pending = dict(decision.pending)
        unseen = False
        for job_id, reason in decision.pending.items():
            note = notes.get(job_id)
            if note is None:
                unseen = True
            elif note != reason.message:
                pending[job_id] = PendingReason(job_id, note, satisfiable=not note.startswith("can never"))
        now = time.monotonic()
        if unseen and now - self._last_kick >= _KICK_SECONDS:
            self._last_kick = now
            self.kick()
        return dataclasses.replace(decision, pending=pending)

    # ----- the ops API --------------------------------------------------------------------------

    def vms(self, include_deleted: bool = False) -> list[dict[str, Any]]:
        """``fray cluster vm list``: every VM as plain data."""
        return self.autoscaler.vms(include_deleted)

    def status(self) -> dict[str, Any]:
        """Scale groups, their VMs by state, and unmet demand (``fray status``, the dashboard)."""
        return self.autoscaler.status()

    def delete_all(self) -> int:
        """``fray cluster down``: stop creating and delete every VM."""
        return self.autoscaler.delete_all()

    def _fault(self, name: str) -> Any:
        method = getattr(self.autoscaler.provider, name, None)
        if method is None:
            raise ConfigError(
                f"the {self.autoscaler.provider.kind} provider cannot inject faults ({name}); "
                "only the simulated provider can"
            )
        return method

    def preempt(self, vm_id: str) -> None:
        """The provider reclaims the VM now; the autoscaler notices at once."""
        self._fault("preempt")(vm_id)
        self.kick()

    def set_quota(self, group: str, exhausted: bool) -> None:
        """The provider answers creates in ``group`` with a quota error (or stops doing so)."""
        self.autoscaler.config.group(group)  # ConfigError naming the groups
        self._fault("set_quota_exhausted")(group, exhausted)
        self.kick()

    def fail_boot(self, group: str, count: int) -> None:
        """The next ``count`` VMs created in ``group`` never finish booting."""
        self.autoscaler.config.group(group)
        self._fault("fail_boot")(group, count)
        self.kick()


def start_autoscaling(controller: Controller, config: ClusterConfig, provider: Provider) -> AutoscaleHost:
    """Give a started controller an autoscaler over ``provider``: ticking, hooked into scheduling and the ops API."""
    service = controller.service

    def lose_worker(worker_id: str, reason: str) -> None:
        with contextlib.suppress(NotFound):  # it never registered: nothing ran there
            service.lose_worker(worker_id, reason)

    def stop_worker(worker_id: str, reason: str) -> None:
        with contextlib.suppress(NotFound):  # it never registered: nothing ran there
            service.stop_worker(worker_id, reason)

    autoscaler = Autoscaler(config, provider, lose_worker=lose_worker, stop_worker=stop_worker)
    host = AutoscaleHost(service, controller.store, autoscaler).start()
    controller.ops.autoscaler = host
    return host
