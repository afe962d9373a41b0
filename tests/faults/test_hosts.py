"""A Fray cluster across hosts (issue 23): a controller host, two worker hosts and a client host, on one LAN.

Each host is a network namespace with its own address (``tests/netns.py``, ``add_lan``): the
controller serves TLS there, workers join with a join token alone (it pins the controller's CA),
and the client host has only a user credential and the controller's address. One scenario, in
order: bad, expired and impostor joins are refused; 20 jobs and a 2-replica gang succeed from the
client host; a 3 s partition reschedules nothing; a 15 s partition re-runs the cut-off host's job
on the other host exactly once, with no beat of the isolated attempt after its replacement began;
the healed worker rejoins and runs new work; a controller killed with SIGKILL and restarted keeps
its tasks' PIDs and loses nothing; a revoked worker leaves the alive list at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fray import Entrypoint, JobRequest, JobStatus, ResourceConfig, current_job
from fray.cluster.client import ClusterClient, ClusterJobHandle
from fray.cluster.protocol.controller_client import ControllerProxy, controller_client
from fray.cluster.protocol.records import WorkerState
from fray.cluster.server.launcher import LocalCluster
from netns import Host, Hosts
from support import alive, wait_until

WORKER_TIMEOUT = 10.0  # the lease is 7.5 s: a 3 s cut (plus TCP's retransmission back-off) stays inside it
HERE = Path(__file__).resolve().parent


def beat(directory: str, tag: str) -> None:
    """Write which host, then the pid, then a timed line every 50 ms until ``tag``.go exists (attempt > 0: one line)."""
    info = current_job()
    assert info is not None
    base = Path(directory)
    (base / f"{tag}.ns-{info.attempt}").write_text(str(os.stat("/proc/self/ns/net").st_ino))
    (base / f"{tag}.beats-{info.attempt}").touch()
    (base / f"{tag}.pid-{info.attempt}").write_text(str(os.getpid()))  # last: the test waits for it
    while True:
        with open(base / f"{tag}.beats-{info.attempt}", "a") as file:
            file.write(f"{time.time()!r}\n")
        if info.attempt > 0 or (base / f"{tag}.go").exists():
            return
        time.sleep(0.05)


def _inode(host: Host) -> str:
    return str(os.stat(f"/run/netns/{host.name}").st_ino)


def _beats(path: Path) -> list[float]:
    return [float(line) for line in path.read_text().split()] if path.exists() else []


def _worker_env(tests_dir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    return {**env, "PYTHONPATH": tests_dir}


def _refused_join(host: Host, address: str, token: str, worker_id: str, workdir: Path, env: dict[str, str]) -> str:
    """``fray worker --join`` run on ``host``: it must exit 2 with one ``error:`` line, which is returned."""
    argv = ["worker", "--controller", address, "--join", token, "--id", worker_id, "--workdir", str(workdir)]
    out = subprocess.run(
        [*host.prefix, sys.executable, "-m", "fray.cli", *argv], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("error: ")]
    return line


def _on(job: ClusterJobHandle, ctl: ControllerProxy) -> str | None:
    """The worker the job's task is on."""
    tasks = ctl.tasks(job.job_id)
    return tasks[0].worker_id if tasks else None


def _start_beating(client: ClusterClient, directory: Path, tag: str) -> tuple[ClusterJobHandle, int]:
    job = client.submit(
        JobRequest(
            name=tag,
            entrypoint=Entrypoint.from_callable(beat, args=(str(directory), tag)),
            resources=ResourceConfig(cpu=1),
            max_retries_preemption=1,
        )
    )
    pid_file = directory / f"{tag}.pid-0"
    wait_until(pid_file.exists, timeout=60, what=f"{tag} to start")
    return job, int(pid_file.read_text())


@pytest.mark.slow
def test_three_hosts_and_a_client_host(tmp_path: Path, hosts: Hosts, monkeypatch: pytest.MonkeyPatch) -> None:
    ctl_host, h1, h2, client_host = hosts.add_lan(4)
    tests_dir = str(HERE.parent)
    env = _worker_env(tests_dir)
    with LocalCluster(
        tmp_path / "cluster",
        worker_timeout=WORKER_TIMEOUT,
        env={"PYTHONPATH": tests_dir},
        host=ctl_host.address,
        controller_prefix=ctl_host.prefix,
    ) as cluster:
        cluster.start_controller()
        assert cluster.ca_file is not None
        monkeypatch.setenv("FRAY_TLS_CA", str(cluster.ca_file))  # the administrator, on the test machine
        admin = ClusterClient(cluster.address, token=cluster.token)
        ctl = controller_client(cluster.address, cluster.token, ca=cluster.ca_file)

        # Refused: garbage, an expired token, another cluster's token, an impostor controller.
        token = cluster.create_token("worker", ttl=600)
        assert token.split()[-1].startswith("sha256:"), "the join token pins the controller's CA"
        assert "not one" in _refused_join(h1, cluster.address, "nonsense", "bad", tmp_path / "bad", env)
        expired = cluster.create_token("worker", ttl=0.2)
        time.sleep(0.5)
        line = _refused_join(h1, cluster.address, expired, "late", tmp_path / "late", env)
        assert "expired, revoked or another cluster's" in line
        with LocalCluster(
            tmp_path / "impostor", host=client_host.address, controller_prefix=client_host.prefix
        ) as impostor:
            impostor.start_controller()
            foreign = impostor.create_token("worker")
            # The real token pointed at the impostor: its CA is not the pinned one, so nothing is sent.
            line = _refused_join(h1, impostor.address, token, "fooled", tmp_path / "fooled", env)
            assert "pins another controller's CA" in line
            # The impostor's token at the real controller: another cluster's.
            line = _refused_join(h1, cluster.address, foreign, "foreign", tmp_path / "foreign", env)
            assert "pins another controller's CA" in line or "another cluster's" in line
        assert ctl.list_workers() == []

        # Two worker hosts join with the token alone (no CA file, no shared credential).
        cluster.add_worker("w1", "--cpu", "1", prefix=h1.prefix, join=token)
        cluster.add_worker("w2", "--cpu", "1", prefix=h2.prefix, join=token)
        cluster.wait_for_workers(2, timeout=60)
        host_of = {"w1": h1, "w2": h2}

        # The client host: a user credential (it pins the CA) and the address, nothing else.
        user_line = cluster.create_token("user:alice")
        out_dir = tmp_path / "jobs"
        out_dir.mkdir()
        client_env = {**env, "FRAY_CLIENT_SPEC": f"fray://{cluster.address}", "FRAY_CREDENTIAL": user_line}
        ran = subprocess.run(
            [*client_host.prefix, sys.executable, str(HERE / "client_host.py"), str(out_dir)],
            env=client_env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        result = json.loads(ran.stdout.strip().splitlines()[-1])
        assert result == {"states": ["succeeded"] * 21, "user": "alice"}
        worker_inodes = {_inode(h1), _inode(h2)}
        assert {(out_dir / f"job-{i}").read_text() for i in range(20)} <= worker_inodes
        assert {(out_dir / f"gang-{r}").read_text() for r in range(2)} == worker_inodes, "one replica per host"

        # A 3 s partition: nothing is lost, nothing rescheduled.
        beats = tmp_path / "beats"
        beats.mkdir()
        short, short_pid = _start_beating(admin, beats, "short")
        cut_id = _on(short, ctl)
        assert cut_id in host_of
        hosts.cut(host_of[cut_id])
        time.sleep(3.0)
        hosts.heal(host_of[cut_id])
        time.sleep(2.0)
        assert alive(short_pid), "a 3 s partition killed the task"
        (beats / "short.go").touch()
        assert short.wait(timeout=60) == JobStatus.SUCCEEDED
        assert short.view().attempt == 0 and not (beats / "short.pid-1").exists()
        states = {w.info.worker_id: w.state for w in ctl.list_workers()}
        assert states == {"w1": WorkerState.ALIVE, "w2": WorkerState.ALIVE}

        # A 15 s partition: the job re-runs on the other host exactly once; the isolated attempt
        # stops before its replacement starts.
        long, long_pid = _start_beating(admin, beats, "long")
        cut_id = _on(long, ctl)
        assert cut_id in host_of
        other = h2 if cut_id == "w1" else h1
        cut_at = time.monotonic()
        hosts.cut(host_of[cut_id])
        wait_until((beats / "long.pid-1").exists, timeout=60, what="the replacement on the other host")
        rescheduled_after = time.monotonic() - cut_at
        assert (beats / "long.ns-1").read_text() == _inode(other)
        assert not alive(long_pid), "the cut-off attempt still runs beside its replacement"
        first_of_replacement = min(wait_until(lambda: _beats(beats / "long.beats-1"), what="the replacement's beat"))
        assert max(_beats(beats / "long.beats-0")) < first_of_replacement
        time.sleep(max(0.0, 15.0 - (time.monotonic() - cut_at)))
        hosts.heal(host_of[cut_id])
        assert long.wait(timeout=60) == JobStatus.SUCCEEDED
        assert long.view().attempt == 1, "exactly one more attempt"
        # Declared lost the timeout after its last *recorded* heartbeat (written at most every 0.5 s), so up to
        # half a second less after the cut: still well after the cut-off worker stopped its task (7.5 s).
        assert WORKER_TIMEOUT - 1.0 <= rescheduled_after < WORKER_TIMEOUT + 10

        # The healed worker rejoins (a new epoch) and runs new work: a gang needs both hosts.
        cluster.wait_for_workers(2, timeout=60)
        assert cluster.workers[cut_id].poll() is None, "the cut-off worker rode out the partition"
        gang = admin.submit(
            JobRequest(
                name="gang-after",
                entrypoint=Entrypoint.from_callable(beat, args=(str(beats), "after")),
                resources=ResourceConfig(cpu=1),
                replicas=2,
            )
        )
        (beats / "after.go").touch()
        assert gang.wait(timeout=60) == JobStatus.SUCCEEDED

        # The controller is killed with SIGKILL and restarted: running tasks keep their PIDs and finish once.
        survivor, survivor_pid = _start_beating(admin, beats, "survivor")
        cluster.kill_controller()
        time.sleep(1.0)
        cluster.start_controller()
        wait_until(
            lambda: len([w for w in ctl.list_workers() if w.info.alive]) == 2,
            timeout=60,
            what="both workers back after the restart",
        )
        assert alive(survivor_pid)
        (beats / "survivor.go").touch()
        assert survivor.wait(timeout=60) == JobStatus.SUCCEEDED
        assert survivor.view().attempt == 0 and not (beats / "survivor.pid-1").exists()

        # A revoked worker leaves the alive list at once, and gives up.
        revoked = ctl.revoke_worker("w2")
        assert revoked.state == WorkerState.REVOKED
        assert [w.info.worker_id for w in ctl.list_workers() if w.info.alive] == ["w1"]
        assert cluster.workers["w2"].wait(timeout=30) == 2
        admin.shutdown()
        ctl.close()
