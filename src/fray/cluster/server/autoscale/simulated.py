"""The ``simulated`` VM provider: every VM is a ``fray worker`` process on this machine.

It is the provider the tests and ``examples/`` use, and the way a user rehearses what
a cloud does to a cluster: a create takes ``boot_seconds`` (by the provider's clock),
quota can run out (:meth:`SimulatedProvider.set_quota_exhausted`), boots can fail
(:meth:`SimulatedProvider.fail_boot`) and VMs can be reclaimed
(:meth:`SimulatedProvider.preempt`).

Boot progresses lazily on every call, by the clock (no thread, so a simulated clock
drives it deterministically): a VM is CREATING for ``boot_seconds``, then RUNNING, and
then -- when the provider has a :class:`WorkerLaunch` -- its worker process is started
in its own session, so that it does not die with the controller (a real VM would not
either). A VM whose worker dies on its own stays RUNNING, as a real VM would; noticing
the lost worker is the autoscaler's business.

With a ``state_dir`` the VMs, the requests seen and the injected faults live in
``state_dir/vms.json`` (0600, replaced atomically, read and written under a lock file),
so that a restarted controller, or ``fray cluster down`` with the controller dead,
sees exactly the VMs there are. Without one everything is in memory (unit tests, the
scale simulation), and listing is a copy of a prepared list.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fray.cluster.server.autoscale.config import ClusterConfig
from fray.cluster.server.autoscale.provider import CloudState, ProviderVm, SliceRequest, VmResources
from fray.cluster.server.launcher import OWNER_ENV
from fray.core._private_files import open_private, private_dir, write_private
from fray.errors import ConfigError, ProviderError, QuotaExceeded, VmNotFound
from fray.process._procident import ProcessIdentity, identify
from fray.resources import format_size

__all__ = ["DEFAULT_BOOT_SECONDS", "DEFAULT_BOOT_TIMEOUT", "SimulatedProvider", "WorkerLaunch", "planned_calls"]

#: Seconds from create to a simulated VM's worker starting, unless ``provider.boot_seconds`` says otherwise.
DEFAULT_BOOT_SECONDS = 1.0
#: The simulated provider's default ``provider.boot_timeout`` (the autoscaler reads it).
DEFAULT_BOOT_TIMEOUT = 10.0
# Seconds a deleted VM's worker gets to stop its tasks after SIGTERM before SIGKILL.
_STOP_GRACE = 5.0
# Request ids remembered for idempotency: far more than the creates in flight at any time.
_MAX_REQUESTS = 10_000
_STATE_VERSION = 1


@dataclass(frozen=True)
class WorkerLaunch:
    """How a simulated VM starts its Fray worker."""

    controller: str
    """The controller's ``HOST:PORT``."""
    credential: str
    """The worker credential line, given to the worker as ``FRAY_CREDENTIAL``."""
    log_dir: Path
    """Where each VM's worker log (``VM_ID.log``) and work directory (``VM_ID/``) go."""


@dataclass(frozen=True)
class _Vm:
    """One simulated VM as the state file records it."""

    vm_id: str
    slice_id: str
    group: str
    host_index: int
    hosts: int
    cluster: str
    state: CloudState
    created_at: float
    boots_at: float
    resources: VmResources
    attributes: tuple[tuple[str, str], ...]
    fails_boot: bool = False
    reason: str = ""
    process: ProcessIdentity | None = None

    def listed(self) -> ProviderVm:
        return ProviderVm(
            self.vm_id, self.slice_id, self.group, self.host_index, self.state, self.created_at, self.reason
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "vm_id": self.vm_id,
            "slice_id": self.slice_id,
            "group": self.group,
            "host_index": self.host_index,
            "hosts": self.hosts,
            "cluster": self.cluster,
            "state": self.state.value,
            "created_at": self.created_at,
            "boots_at": self.boots_at,
            "resources": {
                "cpu": self.resources.cpu,
                "ram_bytes": self.resources.ram_bytes,
                "disk_bytes": self.resources.disk_bytes,
                "devices": list(self.resources.devices),
            },
            "attributes": dict(self.attributes),
            "fails_boot": self.fails_boot,
            "reason": self.reason,
            "process": self.process.to_json() if self.process is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Vm:
        res = data["resources"]
        return cls(
            vm_id=str(data["vm_id"]),
            slice_id=str(data["slice_id"]),
            group=str(data["group"]),
            host_index=int(data["host_index"]),
            hosts=int(data["hosts"]),
            cluster=str(data["cluster"]),
            state=CloudState(data["state"]),
            created_at=float(data["created_at"]),
            boots_at=float(data["boots_at"]),
            resources=VmResources(
                float(res["cpu"]), int(res["ram_bytes"]), int(res["disk_bytes"]), tuple(res["devices"])
            ),
            attributes=tuple(sorted((str(k), str(v)) for k, v in data["attributes"].items())),
            fails_boot=bool(data["fails_boot"]),
            reason=str(data["reason"]),
            process=ProcessIdentity.from_json(data["process"]) if data.get("process") else None,
        )


@dataclass
class _State:
    """Everything the provider knows: its VMs, the requests it served and the faults injected."""

    vms: dict[str, _Vm]
    requests: dict[str, str]
    """request id -> slice id, oldest first."""
    quota_exhausted: set[str]
    fail_boot: dict[str, int]

    @classmethod
    def empty(cls) -> _State:
        return cls({}, {}, set(), {})

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": _STATE_VERSION,
                "vms": [vm.to_json() for vm in self.vms.values()],
                "requests": self.requests,
                "quota_exhausted": sorted(self.quota_exhausted),
                "fail_boot": self.fail_boot,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, source: Path) -> _State:
        try:
            data = json.loads(text)
            return cls(
                vms={vm.vm_id: vm for vm in map(_Vm.from_json, data["vms"])},
                requests={str(k): str(v) for k, v in data["requests"].items()},
                quota_exhausted={str(g) for g in data["quota_exhausted"]},
                fail_boot={str(g): int(n) for g, n in data["fail_boot"].items()},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ProviderError(
                f"the simulated provider's state file {source} is damaged ({exc!r}); "
                "its VMs' workers may still run: stop them by hand, then remove the file"
            ) from None


class SimulatedProvider:
    """A VM provider whose VMs are ``fray worker`` processes on this machine (see the module docstring).

    ``state_dir`` None keeps everything in memory; ``worker`` None starts no processes
    (a VM is then only its state). ``clock`` gives wall-clock seconds: creation times and
    boot progress follow it.
    """

    kind = "simulated"

    def __init__(
        self,
        state_dir: Path | None,
        *,
        cluster: str = "fray",
        boot_seconds: float = DEFAULT_BOOT_SECONDS,
        worker: WorkerLaunch | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if boot_seconds < 0:
            raise ConfigError(f"provider.boot_seconds must be >= 0, got {boot_seconds!r}")
        self.cluster = cluster
        self.boot_seconds = float(boot_seconds)
        self.worker = worker
        self._clock = clock
        self._lock = threading.Lock()
        self._state_dir = private_dir(state_dir) if state_dir is not None else None
        self._memory = _State.empty()
        # VMs still CREATING, so that advancing boots looks at them only (the scale simulation has 1,000 VMs).
        self._creating: set[str] = set()
        self._listing: list[ProviderVm] | None = None
        # Worker processes this provider started: reaped here so that they leave no zombies behind.
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def state_file(self) -> Path | None:
        """Where the VMs are recorded (None in memory)."""
        return self._state_dir / "vms.json" if self._state_dir is not None else None

    # -- the Provider protocol -------------------------------------------------------------------

    def create_slice(self, request: SliceRequest) -> Sequence[ProviderVm]:
        """Create the slice's VMs, CREATING for ``boot_seconds`` (idempotent by request id).

        Raises :class:`~fray.errors.QuotaExceeded` while the group's quota is exhausted.
        """
        if not request.vm_ids:
            raise ProviderError(f"slice {request.slice_id}: a slice needs at least one VM id")
        with self._state() as state:
            self._advance(state)
            known = state.requests.get(request.request_id)
            if known is not None:
                return [vm.listed() for vm in _in_slice(state, known)]
            if request.group in state.quota_exhausted:
                raise QuotaExceeded(
                    f"simulated quota for group {request.group!r} is exhausted "
                    f"(`fray cluster vm quota {request.group} --available` lifts it)"
                )
            taken = [vm_id for vm_id in request.vm_ids if vm_id in state.vms]
            if taken or any(vm.slice_id == request.slice_id for vm in state.vms.values()):
                raise ProviderError(
                    f"slice {request.slice_id} (VMs {', '.join(taken) or 'none'}) already exists under another request"
                )
            now = self._clock()
            attributes = {**request.attributes, "preemptible": "true" if request.preemptible else "false"}
            created = []
            for index, vm_id in enumerate(request.vm_ids):
                fails = state.fail_boot.get(request.group, 0) > 0
                if fails:
                    state.fail_boot[request.group] -= 1
                    if state.fail_boot[request.group] == 0:
                        del state.fail_boot[request.group]
                vm = _Vm(
                    vm_id=vm_id,
                    slice_id=request.slice_id,
                    group=request.group,
                    host_index=index,
                    hosts=len(request.vm_ids),
                    cluster=self.cluster,
                    state=CloudState.CREATING,
                    created_at=now,
                    boots_at=now + self.boot_seconds,
                    resources=request.resources,
                    attributes=tuple(sorted(attributes.items())),
                    fails_boot=fails,
                )
                state.vms[vm_id] = vm
                self._creating.add(vm_id)
                created.append(vm)
            state.requests[request.request_id] = request.slice_id
            while len(state.requests) > _MAX_REQUESTS:
                del state.requests[next(iter(state.requests))]
            self._listing = None
            self._advance(state)  # boot_seconds 0: RUNNING at once
            return [state.vms[vm.vm_id].listed() for vm in created]

    def list_vms(self) -> Sequence[ProviderVm]:
        """Every VM of this cluster (deleted ones are forgotten), boots advanced to now."""
        with self._state() as state:
            self._advance(state)
            if self._listing is None:
                self._listing = [vm.listed() for vm in state.vms.values() if vm.cluster == self.cluster]
            return list(self._listing)

    def delete_slice(self, slice_id: str) -> None:
        """Stop the slice's workers (SIGTERM, SIGKILL after a grace) and forget its VMs; a no-op if it is gone."""
        with self._state() as state:
            doomed = _in_slice(state, slice_id)
            for vm in doomed:
                del state.vms[vm.vm_id]
                self._creating.discard(vm.vm_id)
            self._listing = None
            # Stopped under the lock: a concurrent create of the same VM id waits until the old worker is gone.
            self._stop([vm.process for vm in doomed if vm.process is not None])

    def close(self) -> None:
        """Reap the worker processes that already ended; the VMs (and their workers) stay as they are."""
        with self._lock:
            self._reap()

    # -- fault injection --------------------------------------------------------------------------

    def preempt(self, vm_id: str) -> None:
        """Reclaim the VM now: its worker is SIGKILLed without notice and the VM is PREEMPTED."""
        with self._state() as state:
            self._advance(state)
            vm = state.vms.get(vm_id)
            if vm is None or vm.cluster != self.cluster:
                raise VmNotFound(f"no VM {vm_id!r} in simulated cluster {self.cluster!r}")
            if vm.process is not None:
                self._signal(vm.process, signal.SIGKILL)
                self._reap()
            state.vms[vm_id] = replace(vm, state=CloudState.PREEMPTED, reason="preempted", process=None)
            self._creating.discard(vm_id)
            self._listing = None

    def set_quota_exhausted(self, group: str, exhausted: bool) -> None:
        """While ``exhausted``, creates in ``group`` raise :class:`~fray.errors.QuotaExceeded` (nothing is created)."""
        with self._state() as state:
            if exhausted:
                state.quota_exhausted.add(group)
            else:
                state.quota_exhausted.discard(group)

    def fail_boot(self, group: str, count: int = 1) -> None:
        """The next ``count`` VMs created in ``group`` become RUNNING but never start a worker."""
        if count < 0:
            raise ConfigError(f"fail_boot count must be >= 0, got {count}")
        with self._state() as state:
            if count:
                state.fail_boot[group] = state.fail_boot.get(group, 0) + count
            else:
                state.fail_boot.pop(group, None)

    def faults(self) -> dict[str, Any]:
        """The injected faults still pending: ``{"quota_exhausted": [...], "fail_boot": {group: n}}``."""
        with self._state() as state:
            return {"quota_exhausted": sorted(state.quota_exhausted), "fail_boot": dict(state.fail_boot)}

    def worker_pid(self, vm_id: str) -> int | None:
        """The pid of the VM's worker while it is the process this provider started (None otherwise)."""
        with self._state() as state:
            self._advance(state)
            vm = state.vms.get(vm_id)
            if vm is None or vm.process is None or not vm.process.alive():
                return None
            return vm.process.pid

    # -- internals --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _state(self) -> Iterator[_State]:
        """The state, under the thread lock and (with a state dir) the file lock; saved when the block ends."""
        with self._lock:
            if self._state_dir is None:
                yield self._memory
                return
            lock_fd = open_private(self._state_dir / "vms.lock", os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                path = self._state_dir / "vms.json"
                try:
                    text = path.read_text()
                except FileNotFoundError:
                    state = _State.empty()
                else:
                    state = _State.from_json(text, path)
                # Another process (the CLI with the controller down) may have changed the file.
                self._creating = {vm.vm_id for vm in state.vms.values() if vm.state is CloudState.CREATING}
                self._listing = None
                before = state.to_json()
                try:
                    yield state
                finally:
                    after = state.to_json()
                    if after != before:
                        write_private(path, after, durable=True)
            finally:
                os.close(lock_fd)  # releases the flock

    def _advance(self, state: _State) -> None:
        """Boot the VMs whose ``boots_at`` has come, starting their workers; reap ended workers."""
        self._reap()
        if not self._creating:
            return
        now = self._clock()
        for vm_id in sorted(self._creating, key=lambda v: (state.vms[v].slice_id, state.vms[v].host_index)):
            vm = state.vms[vm_id]
            if vm.boots_at > now:
                continue
            self._creating.discard(vm_id)
            process = None
            if self.worker is not None and not vm.fails_boot:
                process = self._start_worker(vm, self.worker)
            state.vms[vm_id] = replace(vm, state=CloudState.RUNNING, process=process)
            self._listing = None

    def _start_worker(self, vm: _Vm, launch: WorkerLaunch) -> ProcessIdentity | None:
        log_dir = private_dir(launch.log_dir)
        args = [sys.executable, "-m", "fray.cli", *_worker_argv(vm, launch)]
        env = dict(os.environ)
        # A VM's worker holds the worker credential only, never the cluster token its tasks must not see;
        # and it outlives whoever asked for it.
        for name in ("FRAY_TOKEN", "FRAY_CLIENT_SPEC", "FRAY_CREDENTIAL", "FRAY_JOIN", OWNER_ENV):
            env.pop(name, None)
        env["FRAY_CREDENTIAL"] = launch.credential
        env["PYTHONUNBUFFERED"] = "1"
        log = os.fdopen(open_private(log_dir / f"{vm.vm_id}.log"), "ab")
        try:
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # not in the controller's process group: it survives the controller
                close_fds=True,
            )
        finally:
            log.close()
        self._children[proc.pid] = proc
        # The identity lets a later provider (a restarted controller, `fray cluster down`) signal exactly this
        # process. Its command line is the one it will have once exec'd: the child may not have got that far yet.
        found = identify(proc.pid)
        return ProcessIdentity(proc.pid, found.start if found is not None else "", tuple(args))

    def _signal(self, identity: ProcessIdentity, signum: int) -> bool:
        """Signal the worker's process group while its leader is still the recorded process; True if it was."""
        child = self._children.get(identity.pid)
        if child is not None:
            # Started here: the Popen is certain (even before the child has exec'd its command line).
            if child.poll() is not None:
                return False
        elif not identity.start or not identity.alive():
            return False
        try:
            os.killpg(identity.pid, signum)  # the worker leads its own session
        except ProcessLookupError:
            return False
        return True

    def _reap(self) -> None:
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[pid]

    def _stop(self, processes: list[ProcessIdentity]) -> None:
        running = [p for p in processes if self._signal(p, signal.SIGTERM)]
        deadline = time.monotonic() + _STOP_GRACE
        for identity in running:
            while time.monotonic() < deadline and self._running(identity):
                time.sleep(0.02)  # another process's exit: there is nothing to block on
            if self._running(identity):
                self._signal(identity, signal.SIGKILL)
                # SIGKILL is not instant: return only once the worker is gone, as `delete_slice` promises.
                killed = time.monotonic() + _STOP_GRACE
                while time.monotonic() < killed and self._running(identity):
                    time.sleep(0.02)
        for identity in running:
            child = self._children.pop(identity.pid, None)
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=_STOP_GRACE)

    def _running(self, identity: ProcessIdentity) -> bool:
        child = self._children.get(identity.pid)
        if child is not None:
            return child.poll() is None
        return bool(identity.start) and not identity.ended()


def _worker_argv(vm: _Vm, launch: WorkerLaunch) -> list[str]:
    """The ``fray worker ...`` arguments of a simulated VM (after ``python -m fray.cli``)."""
    res = vm.resources
    args = ["worker", "--controller", launch.controller, "--id", vm.vm_id, "--cpu", f"{res.cpu:g}"]
    args += ["--ram", str(res.ram_bytes), "--disk", str(res.disk_bytes), "--workdir", str(launch.log_dir / vm.vm_id)]
    for device in res.devices:
        args += ["--device", device]
    attrs = {**dict(vm.attributes), "scale-group": vm.group, "vm": vm.vm_id}
    if vm.hosts > 1:
        attrs["tpu-name"] = vm.slice_id
        attrs["tpu-worker-id"] = str(vm.host_index)
    for key, value in sorted(attrs.items()):
        args += ["--attr", f"{key}={value}"]
    return args


def _in_slice(state: _State, slice_id: str) -> list[_Vm]:
    return sorted((vm for vm in state.vms.values() if vm.slice_id == slice_id), key=lambda vm: vm.host_index)


def planned_calls(config: ClusterConfig, *, controller: str) -> list[str]:
    """The provider calls ``fray cluster up --config`` would make at start-up: each group's ``min`` slices.

    One line per call (``fray cluster up --dry-run`` prints them), with the worker each VM
    would start; slice and VM ids have the autoscaler's shape, numbered from 0.
    """
    lines = []
    boot = config.provider.number("boot_seconds", DEFAULT_BOOT_SECONDS)
    for group in config.by_priority():
        res = group.resources
        shape = f"cpu={res.cpu:g} ram={format_size(res.ram_bytes)} disk={format_size(res.disk_bytes)}"
        if res.devices:
            shape += " device=" + ",".join(res.devices)
        for index in range(group.min):
            slice_id = f"{config.name}-{group.name}-{index}"
            lines.append(
                f"create_slice(group={group.name}, slice={slice_id}, hosts={group.hosts}, {shape}, "
                f"preemptible={'true' if group.preemptible else 'false'}); after {boot:g}s each VM runs "
                f"`fray worker --controller {controller} --id VM --attr scale-group={group.name} ...`"
            )
    return lines
