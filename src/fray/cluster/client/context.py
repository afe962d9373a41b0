"""``ClusterJobContext``: the job level on a Fray cluster -- tasks on the job's own executor processes.

Tasks do not go through the controller. The process that uses the context (a job's
process, or a script) is the *owner*: it keeps the objects and schedules the tasks
(:class:`~fray.joblevel._task_owner.TaskOwner`, the same owner as ``ProcessJobContext``).
Its workers are **executors**: child jobs it submits to the cluster (placed by the
cluster's scheduler, started through the workers' warm fork servers), each of which
connects back to the owner over TCP, authenticated with a key of this context, and
runs tasks one at a time until the owner goes. So:

* a task costs one round trip between the owner and an executor, not a controller
  transaction, a scheduling pass and a fork (a cluster job per task would cost
  tens of milliseconds; ``benchmarks/tasks.py`` measures both sides);
* ``put`` objects and task results stay with the owner and go straight to the
  executors that need them, each at most once per executor -- never through the
  controller or its SQLite;
* a dead executor fails its task with :class:`~fray.errors.TaskLostError`, and a new
  executor job is submitted when work needs one.

Executors are submitted with ``detached=False`` (they end with the owner's script) and
exit on their own the moment the owner's connection closes. The owner listens on the
address it uses to reach the controller (127.0.0.1 for a cluster on this machine).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
from typing import Any

from fray.errors import ConfigError, FrayError
from fray.job import Entrypoint, JobRequest, JobStatus
from fray.joblevel._task_owner import TaskOwner
from fray.joblevel._task_worker import serve_owner
from fray.resources import ResourceConfig

__all__ = ["DEFAULT_EXECUTORS", "ClusterJobContext"]

#: How many executors (tasks running at once) a context has unless told otherwise.
DEFAULT_EXECUTORS = 4


def _reaching_host(address: str) -> str:
    """This machine's address on the route to ``address`` (``host:port``): where executors can reach the owner."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, int(port)))  # no packet is sent: this only picks the route
        return str(probe.getsockname()[0])
    return "127.0.0.1"


class _ExecutorLauncher:
    """Executors as cluster jobs: submitted from a thread of its own, watched until they connect."""

    def __init__(self, owner: ClusterJobContext, authkey: bytes) -> None:
        self._owner = owner
        self._authkey = authkey
        self._requests: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._jobs: dict[int, Any] = {}  # wid -> job handle
        self._closed = False
        threading.Thread(target=self._submit_loop, name="fray-executors", daemon=True).start()

    def start(self, request: dict[str, Any]) -> None:
        self._requests.put(request)

    def _submit_loop(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            wid = request["wid"]
            job_request = JobRequest(
                name=f"{self._owner.name}-{wid}",
                entrypoint=Entrypoint.from_callable(serve_owner, args=(request, self._authkey)),
                resources=self._owner.resources,
            )
            try:
                job = self._owner.client.submit(job_request, detached=False)
            except Exception as exc:
                self._owner.start_failed(wid, f"the executor job could not be submitted: {exc}")
                continue
            with self._lock:
                if self._closed:
                    job.terminate()
                    continue
                self._jobs[wid] = job
            threading.Thread(target=self._watch, args=(wid, job), name=f"fray-executor-{wid}", daemon=True).start()

    def _watch(self, wid: int, job: Any) -> None:
        # An executor job that ends before its executor connected is a failed start (the owner ignores
        # the report for executors that connected).
        try:
            status = job.wait(raise_on_failure=False)
        except FrayError as exc:
            status, reason = JobStatus.FAILED, str(exc)
        else:
            reason = ""
        if status != JobStatus.SUCCEEDED and not reason:
            with contextlib.suppress(FrayError):
                reason = job.view().error or status.value
        self._owner.start_failed(wid, f"executor job {job.job_id!r} ended {status.value} {reason}".strip())

    def death_note(self, wid: int, pid: int) -> str:
        with self._lock:
            job = self._jobs.get(wid)
        if job is None:
            return ""
        with contextlib.suppress(FrayError, TimeoutError):
            job.wait(timeout=2.0, raise_on_failure=False)
        with contextlib.suppress(FrayError):
            view = job.view()
            detail = view.error or view.state.value
            return f"its executor job {job.job_id!r}: {detail}"
        return ""

    def close(self) -> None:
        with self._lock:
            self._closed = True
            jobs = list(self._jobs.values())
        self._requests.put(None)
        for job in jobs:
            with contextlib.suppress(FrayError):
                job.terminate()


class ClusterJobContext(TaskOwner):
    """The job level on a Fray cluster (see the module docstring).

    ``num_workers`` executors (default :data:`DEFAULT_EXECUTORS`) run tasks at once, each
    a job asking for ``resources`` (default ``ResourceConfig(cpu=1)``); a task's own
    ``resources`` must fit in that. Functions, arguments and results must be picklable,
    and importable where the executors run (the cluster's workers). ``create_actor`` is
    the client's. Executors' output is in their jobs' logs (``NAME-N``, ``name`` default
    ``tasks``).
    """

    def __init__(
        self,
        client: Any,
        num_workers: int | None = None,
        *,
        resources: ResourceConfig | None = None,
        name: str = "tasks",
    ) -> None:
        if resources is not None and not isinstance(resources, ResourceConfig):
            raise ConfigError(f"ClusterJobContext(resources={resources!r}) must be a fray.ResourceConfig")
        super().__init__(
            "cluster",
            DEFAULT_EXECUTORS if num_workers is None else num_workers,
            client=client,
            family="AF_INET",
            host=_reaching_host(client.address),
        )
        self.resources = resources or ResourceConfig(cpu=1)
        self.name = name

    @property
    def client(self) -> Any:
        """The ClusterClient that submits the executors."""
        return self._client

    def _launcher_for(self, address: Any, authkey: bytes) -> _ExecutorLauncher:
        return _ExecutorLauncher(self, authkey)

    def _worker_request(self, wid: int) -> dict[str, Any]:
        request = super()._worker_request(wid)
        request["address"] = list(request["address"])  # (host, port): rebuilt as a tuple by the executor
        return request

    def _check_task_resources(self, resources: ResourceConfig | None) -> None:
        if resources is None:
            return
        mine = self.resources
        if resources.cpu > mine.cpu or resources.ram_bytes > mine.ram_bytes:
            raise ConfigError(
                f"create_task(resources={resources!r}) asks for more than this context's executors have "
                f"({mine!r}); make the context with ClusterJobContext(client, resources=...) so that the tasks fit"
            )
