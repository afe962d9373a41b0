"""Start a controller and workers on this machine as real processes (``fray cluster up``, tests)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fray.cluster.protocol.controller_client import controller_client
from fray.cluster.protocol.credentials import WORKER, Credential, write_credential
from fray.cluster.rpc.tls import is_loopback_address
from fray.core._private_files import open_private, private_dir
from fray.errors import FrayError

__all__ = ["DEFAULT_DRAIN_SECONDS", "OWNER_ENV", "LocalCluster"]

#: Set in the environment of daemons that must not outlive the process that started them
#: (tests, benchmarks): the PID they watch (see ``fray.cli.daemons.wait_for_signal``).
OWNER_ENV = "FRAY_EXIT_WITH_PID"

#: How long a draining worker's tasks get between SIGTERM and SIGKILL unless told (``fray worker --drain-seconds``).
#: Here rather than in the worker package, so that ``fray``'s commands can name it without importing the worker.
DEFAULT_DRAIN_SECONDS = 30.0


class LocalCluster:
    """A controller plus workers, each its own process, state and logs under ``directory``.

    The controller binds 127.0.0.1 and requires ``token`` (a fresh random one by
    default); its state goes to ``db_path`` (default ``directory/controller.db``); ``env``
    is added to every process's environment (and so to its tasks'); ``controller_args``
    are more ``fray controller`` options. With ``exit_with_owner`` (the default) the daemons
    end soon after this process does, even if :meth:`stop` never ran. Processes are started detached (own session)
    so that tests can kill them with SIGKILL one by one, as a machine failure would.

    ``controller_prefix`` is put before the controller's command line, to run it somewhere
    else than where the workers run: tests start it inside a simulated host with
    ``["ip", "netns", "exec", NAME]`` (``tests/netns.py``) and bind ``host`` to that host's
    address. The prefix must exec the command (as ``ip netns exec`` does), so that the pid
    this class signals is the controller's.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        token: str | None = None,
        port: int = 0,
        worker_timeout: float = 10.0,
        env: dict[str, str] | None = None,
        controller_args: Sequence[str] = (),
        db_path: str | Path | None = None,
        host: str = "127.0.0.1",
        exit_with_owner: bool = True,
        controller_prefix: Sequence[str] = (),
    ) -> None:
        self.extra_env = dict(env or {})
        # Daemons end when this process does, even if it never called stop() (a test run
        # killed by a timeout); `fray cluster up` turns it off: its daemons outlive the command.
        self.exit_with_owner = exit_with_owner
        self.directory = private_dir(directory)
        self.db_path = Path(db_path) if db_path is not None else self.directory / "controller.db"
        self.host = host
        #: The cluster CA, which the controller makes when it binds a non-loopback ``host``.
        self.ca_file = None if is_loopback_address(host) else self.db_path.parent / "tls" / "ca.pem"
        self.token = token or secrets.token_hex(16)
        #: What workers authenticate with (see :mod:`fray.cluster.protocol.credentials`), also kept in
        #: ``directory/worker.credential`` (0600) for workers started by hand on this machine.
        self.worker_credential = Credential.mint(self.token.encode(), WORKER)
        write_credential(self.directory / "worker.credential", self.worker_credential)
        self.port = port
        self.worker_timeout = worker_timeout
        self.controller_args = list(controller_args)
        self.controller_prefix = list(controller_prefix)
        self.controller: subprocess.Popen[bytes] | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.address = ""

    @property
    def env(self) -> dict[str, str]:
        """The environment a client needs: the token and the client spec (and the CA, with TLS)."""
        env = {"FRAY_TOKEN": self.token, "FRAY_CLIENT_SPEC": f"fray://{self.address}"}
        if self.ca_file is not None:
            env["FRAY_TLS_CA"] = str(self.ca_file)
        return env

    def _spawn(
        self, args: list[str], log_name: str, *, worker: bool = False, prefix: Sequence[str] = (), joins: bool = False
    ) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self.extra_env, "FRAY_TOKEN": self.token, "PYTHONUNBUFFERED": "1"}
        env.pop("FRAY_CLIENT_SPEC", None)
        env.pop("FRAY_CREDENTIAL", None)
        env.pop(OWNER_ENV, None)
        if self.exit_with_owner:
            env[OWNER_ENV] = str(os.getpid())
        if self.ca_file is not None and not joins:
            env["FRAY_TLS_CA"] = str(self.ca_file)
        if worker:
            # Workers hold the worker credential only: never the cluster token, which their tasks must not see.
            del env["FRAY_TOKEN"]
            if not joins:  # a joining worker has its join token, which pins the CA, and nothing else
                env["FRAY_CREDENTIAL"] = self.worker_credential.encode()
        log = os.fdopen(open_private(self.directory / log_name), "ab")
        try:
            return subprocess.Popen(
                [*prefix, sys.executable, "-m", "fray.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        finally:
            log.close()

    def start_controller(self, timeout: float = 30.0) -> str:
        """Start (or restart, on the same port) the controller; return its address."""
        address_file = self.directory / "controller.address"
        address_file.unlink(missing_ok=True)
        args = [
            "controller",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--db",
            str(self.db_path),
            "--address-file",
            str(address_file),
            "--worker-timeout",
            str(self.worker_timeout),
            # Its clients get the CA from `env` (FRAY_TLS_CA): nothing is recorded in the user's home.
            *([] if self.ca_file is None else ["--no-record-ca"]),
            *self.controller_args,
        ]
        self.controller = self._spawn(args, "controller.log", prefix=self.controller_prefix)
        deadline = time.monotonic() + timeout
        while not address_file.exists():
            if self.controller.poll() is not None:
                log = self.directory / "controller.log"
                said = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("error: ")]
                why = f": {said[-1].removeprefix('error: ')}" if said else ""
                raise FrayError(f"the controller exited with {self.controller.returncode}{why}; see {log}")
            if time.monotonic() > deadline:
                raise FrayError(
                    f"the controller did not start within {timeout}s; see {self.directory / 'controller.log'}"
                )
            time.sleep(0.005)
        self.address = address_file.read_text().strip()
        self.port = int(self.address.rsplit(":", 1)[1])
        return self.address

    def add_worker(
        self, worker_id: str, *extra: str, prefix: Sequence[str] = (), join: str | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a worker process (``extra``: more ``fray worker`` options such as ``--cpu 2``).

        ``prefix`` goes before its command, as ``controller_prefix`` does for the controller's
        (e.g. ``ip netns exec HOST``: a worker on a simulated host). With ``join`` (a join token,
        :meth:`create_token`) the worker joins as one on another machine would: with that token
        alone, no shared worker credential and no CA file.
        """
        args = [
            "worker",
            "--controller",
            self.address,
            "--id",
            worker_id,
            "--workdir",
            str(self.directory / worker_id),
            *extra,
            *(("--join", join) if join else ()),
        ]
        proc = self._spawn(args, f"{worker_id}.log", worker=True, prefix=prefix, joins=join is not None)
        self.workers[worker_id] = proc
        return proc

    def create_token(self, role: str = "worker", ttl: float | None = None) -> str:
        """A join token (``role="worker"``) or a user credential (``"user:NAME"``), as ``fray token create`` prints it."""
        client = controller_client(self.address, self.token, ca=self.ca_file)
        try:
            return str(client.create_token(role, ttl)["line"])
        finally:
            client.close()

    def wait_for_workers(self, count: int, timeout: float = 30.0) -> None:
        """Block until ``count`` workers are registered and alive."""
        client = controller_client(self.address, self.token, ca=self.ca_file)
        deadline = time.monotonic() + timeout
        try:
            while True:
                alive = [w for w in client.list_workers() if w.info.alive]
                if len(alive) >= count:
                    return
                if time.monotonic() > deadline:
                    raise FrayError(f"only {len(alive)} of {count} workers registered after {timeout}s")
                time.sleep(0.01)
        finally:
            client.close()

    def start(self, workers: int = 2, *worker_args: str, timeout: float = 30.0) -> LocalCluster:
        """Start the controller and ``workers`` workers and wait until they are all registered."""
        self.start_controller(timeout)
        for i in range(workers):
            self.add_worker(f"worker-{i}", *worker_args)
        self.wait_for_workers(workers, timeout)
        return self

    def kill_controller(self) -> None:
        """SIGKILL the controller, as a crash would."""
        if self.controller is not None and self.controller.poll() is None:
            self.controller.kill()
            self.controller.wait()

    def kill_worker(self, worker_id: str) -> None:
        """SIGKILL one worker, as a machine failure would (its tasks die with it)."""
        proc = self.workers[worker_id]
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        """Stop every process: workers first (they drain: stop their tasks and tell the controller), then the controller."""
        for group in (list(self.workers.values()), [self.controller] if self.controller else []):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            for proc in group:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
