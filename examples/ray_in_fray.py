"""Ray inside a Fray job: a three-replica ``fray://`` job boots a Ray cluster and runs a Ray program on it.

Seed 001 ("Execution -> Job Environment"): some users' code is written for Ray. Fray
hosts it as one gang job: each of the ``replicas`` replicas starts one Ray node
(``ray start --block``, its own temp dir, free ports, one CPU, a small object store,
no dashboard). Replica 0 starts the head, publishes its address through Fray (a small
``Rendezvous`` actor passed to every replica), waits until the others have joined and
then runs the user's entrypoint in a child process with ``FRAY_CLIENT_SPEC=ray`` and
``RAY_ADDRESS`` pointing at that head, so ``fray.current_client()`` in the user's code
is a Ray client of the job's own Ray cluster. The other replicas join the head and wait
until replica 0 says the program is done. Every replica records the processes its Ray
node started (its ``ray start`` and all that process's descendants, by PID); when the
Fray job ends -- normally, or terminated -- those processes are gone with it: Fray kills
each replica's process group, and Ray's processes share their ``ray start``'s fate.

Limits, as written: the head publishes itself as ``127.0.0.1:PORT`` and :func:`run`
cleans the nodes' temp dirs from the driver's machine, so the replicas must share one
machine (as on ``fray cluster up``); across machines the head would publish its host's
address and each replica would clean its own temp dir.

Run it (``fray://`` only: it is about Fray hosting Ray; on the local backend and on Ray
itself it says so and exits):

    fray cluster up   # or any running Fray cluster
    FRAY_CLIENT_SPEC=fray://HOST:PORT python examples/ray_in_fray.py
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

import fray
from fray import ActorConfig, ConfigError, Entrypoint, JobRequest, ResourceConfig

_STEP = 0.2  # seconds between looks at the Ray processes and at the rendezvous
_RAY_START_SECONDS = 180.0  # how long a Ray node may take to start on a busy machine
_CALL_WAIT = 5.0  # seconds one call to the rendezvous waits for news (a short call; callers repeat it)
_USER_RUNNER = """
import sys, cloudpickle
with open(sys.argv[1], "rb") as f:
    fn, args = cloudpickle.load(f)
fn(*args)
"""


class Rendezvous:
    """Where the replicas meet: replica 0 publishes the Ray head's address, the others join and wait."""

    def __init__(self, replicas: int) -> None:
        self._replicas = replicas
        self._head: tuple[str, str] | None = None
        self._joined: set[int] = set()
        self._done = False
        self._changed = asyncio.Event()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _until(self, ready: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not ready():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return ready()
        return True

    async def publish_head(self, address: str, token: str) -> None:
        self._head = (address, token)
        self._touch()

    async def head(self, timeout: float) -> tuple[str, str] | None:
        """The head's address and auth token, or None if not published within ``timeout`` seconds."""
        await self._until(lambda: self._head is not None, timeout)
        return self._head

    async def join(self, replica: int) -> None:
        self._joined.add(replica)
        self._touch()

    async def all_joined(self, timeout: float) -> bool:
        return await self._until(lambda: len(self._joined) == self._replicas - 1, timeout)

    async def finish(self) -> None:
        self._done = True
        self._touch()

    async def finished(self, timeout: float) -> bool:
        return await self._until(lambda: self._done, timeout)


@dataclass(frozen=True)
class RayInFrayResult:
    """What the user's Ray program saw, and what became of the Ray processes the replicas started."""

    fray_status: str  # the Fray job's final status
    program: dict[str, Any]  # what the user's program reported (client backend, Ray nodes, its job)
    ray_processes: tuple[tuple[int, int, str], ...]  # (replica, pid, process name), all the replicas started
    still_running: tuple[int, ...]  # of those, the PIDs still alive after the job ended
    temp_dirs: tuple[str, ...]  # the Ray nodes' temp dirs (removed once nothing runs there)


def ray_program(result_path: str, hold: bool) -> None:
    """The user's program: plain Fray-on-Ray code that knows nothing of the cluster around it."""
    import ray

    client = fray.current_client()
    out = Path(result_path).with_suffix(".job")
    job = client.submit(JobRequest(name="hello", entrypoint=Entrypoint.from_callable(_say_hello, args=(str(out),))))
    status = job.wait(timeout=300)
    report = {
        "client": type(client).__name__,
        "ray_nodes": len([n for n in ray.nodes() if n["Alive"]]),
        "job_status": str(status),
        "job_output": out.read_text(),
    }
    _write_atomically(Path(result_path), json.dumps(report))
    print(f"ray program: {report['ray_nodes']} Ray nodes, inner job {status}")
    if hold:  # a long-running program: it ends when the Fray job is terminated
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            time.sleep(0.5)


def _say_hello(path: str) -> None:
    import ray

    Path(path).write_text(f"hello from Ray node {ray.get_runtime_context().get_node_id()[:8]}")


def ray_node(rendezvous: Any, workdir: str, program: Callable[..., None], args: tuple[Any, ...]) -> None:
    """One replica of the Fray job: start a Ray node; on replica 0 the head and the user's program."""
    info = fray.current_job()
    assert info is not None
    temp_dir = tempfile.mkdtemp(prefix="fr-ray-")  # short: Ray's socket paths must fit in 107 bytes
    pid_file = Path(workdir) / f"pids-{info.replica_index}-{info.attempt}.json"
    # Terminated replicas cannot clean up after themselves: the driver removes these too (see run()).
    _write_atomically(Path(workdir) / f"tempdir-{info.replica_index}-{info.attempt}", temp_dir)
    node: _RayNode | None = None
    try:
        if info.replica_index == 0:
            # The job's Ray has a token of its own, handed to the other replicas through Fray.
            token = secrets.token_hex(32)

            def head_args() -> list[str]:
                return [
                    "--head", "--include-dashboard=false", f"--port={_free_port()}",
                    f"--ray-client-server-port={_free_port()}", f"--dashboard-port={_free_port()}", *_node_ports(),
                ]  # fmt: skip

            node = _RayNode(head_args, temp_dir, token, pid_file)
            head = f"127.0.0.1:{node.flag('port')}"
            rendezvous.publish_head(head, token)
            try:
                if not _poll(lambda: rendezvous.all_joined(_CALL_WAIT), _RAY_START_SECONDS):
                    raise RuntimeError(f"not every replica's Ray node joined the head within {_RAY_START_SECONDS}s")
                _run_program(node, head, token, workdir, program, args)
            finally:
                rendezvous.finish()
        else:
            found = _poll(lambda: rendezvous.head(_CALL_WAIT), _RAY_START_SECONDS)
            if found is None:
                raise RuntimeError(f"replica 0 published no Ray head within {_RAY_START_SECONDS}s")
            head, token = found
            node = _RayNode(lambda: [f"--address={head}", *_node_ports()], temp_dir, token, pid_file)
            rendezvous.join(info.replica_index)
            while not rendezvous.finished(_CALL_WAIT):
                if node.proc.poll() is not None:
                    raise RuntimeError(f"this replica's Ray node exited with {node.proc.returncode}")
    finally:  # a terminated job never gets here: its replicas' process groups are killed, Ray's with them
        if node is not None:
            node.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


_NODE_PORT_FLAGS = (
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)
_START_ATTEMPTS = 3  # a port picked free can be taken before Ray binds it: start again on fresh ports


def _node_ports() -> list[str]:
    return [f"--{flag}={_free_port()}" for flag in _NODE_PORT_FLAGS]


class _RayNode:
    """One ``ray start --block`` and the PIDs of every process it started."""

    def __init__(self, args: Callable[[], list[str]], temp_dir: str, token: str, pid_file: Path) -> None:
        """Start the node with ``args()`` (fresh ports each try); a ``ray start`` that exits at once is tried again."""
        self._labels: dict[int, str] = {}  # processes named by what they are to us
        self._pids: dict[int, str] = {}  # every try's processes: a failed one may have left some behind
        self._lock = threading.Lock()  # the tracking thread and the replica both add PIDs
        self._pid_file: Path | None = None
        env = {**os.environ, **_ray_auth(token), "RAY_USAGE_STATS_ENABLED": "0"}
        for attempt in range(1, _START_ATTEMPTS + 1):
            self.argv = [
                sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--node-ip-address=127.0.0.1",
                "--num-cpus=1", "--object-store-memory=80000000",
                "--disable-usage-stats", f"--temp-dir={temp_dir}", *args(),
            ]  # fmt: skip
            self.proc = subprocess.Popen(
                self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
            )
            self.add(self.proc.pid, "ray start")
            up, settled = threading.Event(), threading.Event()  # settled: up, or its output ended
            threading.Thread(target=self._forward_output, args=(self.proc, up, settled), daemon=True).start()
            self._track(pid_file)
            if not settled.wait(_RAY_START_SECONDS):
                self.stop()
                raise RuntimeError(f"the Ray node did not start within {_RAY_START_SECONDS}s: {' '.join(self.argv)}")
            if up.is_set() and self.proc.poll() is None:
                return
            self.proc.wait()  # its output ended before "Ray runtime started": it is exiting
            self._record(pid_file)
            if attempt == _START_ATTEMPTS:
                raise RuntimeError(
                    f"ray start exited with {self.proc.returncode} in each of {attempt} tries; see its output above"
                )
            print(f"[ray] ray start exited with {self.proc.returncode}; trying again on fresh ports", flush=True)

    def flag(self, name: str) -> str:
        """The value this node was started with for ``--name``."""
        prefix = f"--{name}="
        return next(arg[len(prefix) :] for arg in self.argv if arg.startswith(prefix))

    @staticmethod
    def _forward_output(proc: subprocess.Popen[str], up: threading.Event, settled: threading.Event) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"[ray] {line.rstrip()}", flush=True)
            if "Ray runtime started" in line:
                up.set()
                settled.set()
        settled.set()  # it exited (or is exiting) without saying so: the starter tries again

    def _track(self, pid_file: Path) -> None:
        """Record the node's processes in ``pid_file`` now and every moment until it stops."""
        self._pid_file = pid_file
        self._record(pid_file)
        proc = self.proc  # one loop per try: it ends with its own ``ray start``

        def loop() -> None:
            while proc.poll() is None:
                try:
                    self._record(pid_file)
                except OSError as exc:  # a full disk, say: keep looking, the next write may succeed
                    print(f"[ray] could not record the node's processes: {exc}", flush=True)
                time.sleep(_STEP)

        threading.Thread(target=loop, daemon=True).start()

    def add(self, pid: int, name: str) -> None:
        """Track one more process that belongs with this node."""
        with self._lock:
            self._labels[pid] = name
            self._pids[pid] = name

    def _record(self, pid_file: Path) -> None:
        # A process can end between the listing and the read of its name: keep the name it had.
        names = {pid: _process_name(pid) for pid in _descendants(self.proc.pid)}
        found = {pid: name for pid, name in names.items() if name is not None}
        with self._lock:
            # A fresh name wins: a child seen between fork and exec still has its parent's name.
            self._pids.update(found)
            self._pids.update(self._labels)
            _write_atomically(pid_file, json.dumps(sorted(self._pids.items())))

    def stop(self) -> None:
        """Stop the node as ``ray start --block`` expects (SIGTERM), and wait for it."""
        if self.proc.poll() is None and self._pid_file is not None:
            self._record(self._pid_file)  # one last look, with every process's name final by now
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _ray_auth(token: str) -> dict[str, str]:
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


def _run_program(
    node: _RayNode, head: str, token: str, workdir: str, program: Callable[..., None], args: tuple[Any, ...]
) -> None:
    payload = Path(workdir) / "program.pkl"
    payload.write_bytes(cloudpickle.dumps((program, args)))
    # The program is a Ray driver of this job's Ray, not a Fray job replica: none of Fray's job variables.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env.update(FRAY_CLIENT_SPEC="ray", RAY_ADDRESS=head, **_ray_auth(token))
    done = subprocess.Popen([sys.executable, "-c", _USER_RUNNER, str(payload)], env=env)
    node.add(done.pid, "ray program")  # the Ray driver: it must go with the job too
    if done.wait() != 0:
        raise RuntimeError(f"the Ray program exited with {done.returncode}; see its output above")


def _poll(ask: Callable[[], Any], timeout: float) -> Any:
    """Repeat ``ask`` (a call that itself waits a moment for news) until it answers or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    answer = ask()
    while not answer and time.monotonic() < deadline:
        answer = ask()
    return answer


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it, from every process's parent in /proc.

    (Not /proc's per-thread ``children`` lists: the kernel documents them as unreliable
    while threads come and go, and Ray's processes are full of threads.)
    """
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # after "(comm)": state, then the parent's PID
        children.setdefault(parent, []).append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack += children.get(pid, [])
    return found


def _process_name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None  # it has ended


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def run(
    client: Any,
    workdir: str | Path,
    *,
    name: str = "ray-in-fray",
    replicas: int = 3,
    terminate_when_running: bool = False,
    timeout: float = 600.0,
) -> RayInFrayResult:
    """Run the Ray program on a Ray cluster booted inside a ``replicas``-replica Fray job.

    With ``terminate_when_running`` the program keeps running after it reported, and
    the Fray job is terminated then. Either way the result says which of the Ray
    processes the replicas started are still running once the job has ended.
    """
    from fray.cluster.client import ClusterClient

    if not isinstance(client, ClusterClient):
        raise ConfigError(
            f"ray_in_fray boots a Ray cluster inside a Fray cluster job, so it runs on fray:// only, not on "
            f"{type(client).__name__}; start a Fray cluster and set FRAY_CLIENT_SPEC=fray://HOST:PORT"
        )
    workdir = Path(workdir)
    result_path = workdir / "program.json"
    # Every replica waits on the rendezvous at once: let their calls run side by side.
    config = ActorConfig(max_concurrency=replicas + 1)
    rendezvous = client.create_actor(Rendezvous, replicas, name=f"{name}-rendezvous", actor_config=config)
    request = JobRequest(
        name=name,
        entrypoint=Entrypoint.from_callable(
            ray_node, args=(rendezvous, str(workdir), ray_program, (str(result_path), terminate_when_running))
        ),
        # Half a core each (each Ray node still starts with --num-cpus=1): three replicas fit the
        # 2 cores of a small machine, which `fray cluster up` divides among its workers.
        resources=ResourceConfig(cpu=0.5),
        replicas=replicas,
    )
    job = client.submit(request)
    deadline = time.monotonic() + timeout
    if terminate_when_running:
        while not (result_path.exists() and _tracked_since(workdir, result_path.stat().st_mtime, replicas)):
            if job.status().finished or time.monotonic() > deadline:
                job.wait(timeout=0)
                raise TimeoutError(f"job {job.job_id}: the Ray program did not report within {timeout}s")
            time.sleep(_STEP)
        job.terminate()
    status = job.wait(timeout=max(1.0, deadline - time.monotonic()), raise_on_failure=not terminate_when_running)
    processes = _recorded(workdir)
    gone_by = time.monotonic() + 60  # the kills are sent; dying takes a moment on a busy machine
    while any(_pid_alive(pid) for _, pid, _ in processes) and time.monotonic() < gone_by:
        time.sleep(_STEP)
    still_running = tuple(pid for _, pid, _ in processes if _pid_alive(pid))
    temp_dirs = tuple(sorted(path.read_text() for path in workdir.glob("tempdir-*")))
    if not still_running:  # Ray's session files (logs, sockets) of the job's nodes, on this machine
        for path in temp_dirs:
            shutil.rmtree(path, ignore_errors=True)
    return RayInFrayResult(
        fray_status=str(status),
        program=json.loads(result_path.read_text()),
        ray_processes=processes,
        still_running=still_running,
        temp_dirs=temp_dirs,
    )


def _recorded(workdir: Path) -> tuple[tuple[int, int, str], ...]:
    found = []
    for path in sorted(workdir.glob("pids-*.json")):
        replica = int(path.name.split("-")[1])
        found += [(replica, int(pid), str(comm)) for pid, comm in json.loads(path.read_text())]
    return tuple(sorted(found))


def _tracked_since(workdir: Path, when: float, replicas: int) -> bool:
    """True once every replica recorded its Ray processes after ``when`` (so none started before is missed)."""
    files = list(workdir.glob("pids-*.json"))
    return len(files) == replicas and all(p.stat().st_mtime > when for p in files)


if __name__ == "__main__":
    from _extras import answer_help, cannot_run, capacity, require

    answer_help(__doc__)

    require("ray", "ray")  # the replicas (on this machine's workers) run Ray from this same install
    current = fray.current_client()
    # One Ray node per half-core replica, all at once (a gang): as many as fit, up to 3.
    cap = capacity(current)
    replicas = 3
    if cap is not None:
        replicas = min(3, cap.slots(0.5))
        if replicas < 1:
            cannot_run(f"its replicas need half a core each; it has {cap.describe()}")
        if replicas < 3:
            print(f"(the cluster has room for {replicas} half-core replicas at once: a Ray cluster of {replicas})")
    with tempfile.TemporaryDirectory(prefix="fray-ray-in-fray-") as tmp:
        try:
            result = run(current, tmp, replicas=replicas)
        except ConfigError as exc:
            sys.exit(str(exc))
    print(f"Fray job {result.fray_status}; the Ray program saw {result.program['ray_nodes']} Ray nodes")
    print(f"  its client: {result.program['client']}; its job: {result.program['job_status']}")
    print(f"  {result.program['job_output']}")
    print(
        f"  Ray processes started by the replicas: {len(result.ray_processes)}, still running: {len(result.still_running)}"
    )
