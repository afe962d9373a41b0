"""docs/cluster.md's several-machines walk-through, run as written (issue 36): its commands are read from the doc.

Each machine of the walk-through is a simulated host (``tests/netns.py``) with a shell of its own
(its own ``HOME``, no ``FRAY_*`` variable of the test's): the controller's machine, a worker
machine and alice's laptop. The doc's address ``10.0.0.5`` becomes the controller host's, the
``...`` placeholders the lines the earlier commands printed, ``ID`` the id the step is about, and
``my_pipeline.py`` a small script; everything else runs verbatim through ``bash``. So an edit of
the doc that breaks a command breaks this test, and nothing here contacts 10.0.0.5 or any address
but the simulated hosts'.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from netns import Host, Hosts
from support import wait_until

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cluster.md"
DOC_ADDRESS = "10.0.0.5"
JOIN_PLACEHOLDER = "'fray-credential-v1 join:...'"
USER_PLACEHOLDER = "'fray-credential-v1 user:alice#... sha256:...'"

PIPELINE = """
import fray
from fray import Entrypoint, JobRequest, ResourceConfig


def square(x):
    return x * x


client = fray.current_client()
job = client.submit(
    JobRequest(name="square", entrypoint=Entrypoint.from_callable(square, args=(7,)), resources=ResourceConfig(cpu=1))
)
print("pipeline", job.wait(timeout=60).value, job.view().user)
"""


def walkthrough() -> dict[int, list[str]]:
    """The commands of each numbered step of the doc's "Several machines" section, in order."""
    section = DOC.read_text().split("\n## Several machines\n", 1)[1].split("\n## ", 1)[0]
    steps: dict[int, list[str]] = {}
    step = 0
    for line in section.splitlines():
        numbered = re.match(r"^(\d+)\. \*\*", line)
        if numbered:
            step = int(numbered.group(1))
        elif step and line.startswith(" " * 7) and line.strip():  # a code block inside the step's list item
            steps.setdefault(step, []).append(line.strip())
    return steps


class Shell:
    """One machine's shell: commands run with ``bash`` inside ``host``, ``export`` lines change its environment."""

    def __init__(self, host: Host, home: Path) -> None:
        self.host = host
        home.mkdir(parents=True)
        self.home = home
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
        bindir = str(Path(sys.executable).parent)  # `fray` and `python` of this interpreter, as a user's venv gives
        self.env = {**inherited, "HOME": str(home), "PATH": bindir + os.pathsep + inherited.get("PATH", "")}
        self.daemons: list[subprocess.Popen[str]] = []

    def line(self, command: str) -> str:
        assert DOC_ADDRESS not in command, command
        return command

    def run(self, command: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``command`` to completion (an ``export`` line sets the shell's variables)."""
        command = self.line(command)
        if command.startswith("export "):
            out = subprocess.run(
                [*self.host.prefix, "bash", "-c", f"{command} && env -0"],
                env=self.env,
                cwd=self.home,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, f"{command}: {out.stderr}"
            self.env = dict(item.split("=", 1) for item in out.stdout.split("\0") if "=" in item)
            return out
        out = subprocess.run(
            [*self.host.prefix, "bash", "-c", command],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check:
            assert out.returncode == 0, f"{command} exited {out.returncode}:\n{out.stdout}{out.stderr}"
        return out

    def start(self, command: str, log: Path) -> subprocess.Popen[str]:
        """Run a daemon (``fray controller``, ``fray worker``) in the background; it ends with the test."""
        command = self.line(command)
        env = {**self.env, "FRAY_EXIT_WITH_PID": str(os.getpid())}
        with log.open("w") as out:
            daemon = subprocess.Popen(
                [*self.host.prefix, "bash", "-c", f"exec {command}"],
                env=env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        self.daemons.append(daemon)
        return daemon

    def stop(self) -> None:
        for daemon in self.daemons:
            if daemon.poll() is None:
                daemon.terminate()
                try:
                    daemon.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()


def test_the_doc_commands_parse() -> None:
    """The section has the five steps and the commands this test relies on (an edit that drops one fails here)."""
    steps = walkthrough()
    assert sorted(steps) == [1, 2, 3, 4, 5], steps
    assert steps[1][-1].startswith("fray controller --host 10.0.0.5 ")
    assert steps[2] == ["fray token create --role worker --ttl 3600 --controller 10.0.0.5:7100"]
    assert JOIN_PLACEHOLDER in steps[3][0]
    assert USER_PLACEHOLDER in steps[4][1] and steps[4][2] == "python my_pipeline.py"
    assert any(line.startswith("fray worker revoke ID") for line in steps[5])
    assert any(line.startswith("fray token revoke ID") for line in steps[5])


@pytest.mark.slow
def test_several_machines_walkthrough_as_written(tmp_path: Path, hosts: Hosts) -> None:
    steps = walkthrough()
    ctl_host, worker_host, laptop_host = hosts.add_lan(3)
    here = ctl_host.address

    def ours(command: str) -> str:
        return command.replace(DOC_ADDRESS, here)

    admin = Shell(ctl_host, tmp_path / "controller-machine")
    worker_machine = Shell(worker_host, tmp_path / "worker-machine")
    alice = Shell(laptop_host, tmp_path / "laptop")
    try:
        # 1. The controller, in the administrator's shell (the export, then the daemon).
        *exports, start_controller = steps[1]
        for command in exports:
            admin.run(ours(command))
        assert len(admin.env["FRAY_TOKEN"]) == 32
        controller = admin.start(ours(start_controller), tmp_path / "controller.log")
        wait_until(
            lambda: "fray controller serving on" in (tmp_path / "controller.log").read_text() or controller.poll(),
            timeout=60,
            what="the controller to serve",
        )
        assert controller.poll() is None, (tmp_path / "controller.log").read_text()
        said = (tmp_path / "controller.log").read_text()
        assert f"{admin.home}/.local/state/fray/tls/ca.pem" in said, said
        assert (admin.home / ".config" / "fray" / "cas" / f"{here}-7100.pem").exists()

        # Loopback is refused (the controller listens on its --host only), and the error says where it listens.
        refused = admin.run(ours(steps[2][0]).replace(f"{here}:7100", "127.0.0.1:7100"), check=False)
        assert refused.returncode == 2, refused.stderr
        assert f"--controller {here}:7100" in refused.stderr, refused.stderr

        # 2. A join token: found the CA by itself (no FRAY_TLS_CA in the shell).
        assert "FRAY_TLS_CA" not in admin.env
        (join_line,) = admin.run(ours(steps[2][0])).stdout.splitlines()
        assert join_line.startswith("fray-credential-v1 join:") and join_line.split()[-1].startswith("sha256:")

        # Without the CA, a machine that is not the controller's is told where it is.
        worker_machine.env["FRAY_TOKEN"] = admin.env["FRAY_TOKEN"]
        lost = worker_machine.run(f"fray token list --controller {here}:7100", check=False)
        del worker_machine.env["FRAY_TOKEN"]
        assert lost.returncode == 2 and "Traceback" not in lost.stderr, lost.stderr
        assert "no CA of its cluster here" in lost.stderr and "FRAY_TLS_CA" in lost.stderr, lost.stderr
        assert "beside its database" in lost.stderr, lost.stderr

        # 3. The worker joins with the token alone.
        (join_worker,) = steps[3]
        worker = worker_machine.start(
            ours(join_worker).replace(JOIN_PLACEHOLDER, shlex.quote(join_line)), tmp_path / "worker.log"
        )

        def workers() -> list[dict[str, object]]:
            listed = admin.run(ours(steps[5][0]) + " --json", check=False)
            return json.loads(listed.stdout) if listed.returncode == 0 else []

        (joined,) = wait_until(lambda: [w for w in workers() if w["state"] == "alive"], timeout=60, what="the join")
        assert joined["cpu"] == 8

        # 4. A user credential for alice, and her pipeline from the laptop.
        mint_user, export_user, run_pipeline = steps[4]
        (user_line,) = admin.run(ours(mint_user)).stdout.splitlines()
        assert user_line.startswith("fray-credential-v1 user:alice#")
        (alice.home / "my_pipeline.py").write_text(PIPELINE)
        alice.run(ours(export_user).replace(USER_PLACEHOLDER, shlex.quote(user_line)))
        assert alice.env["FRAY_CREDENTIAL"] == user_line
        assert alice.run(run_pipeline).stdout.splitlines()[-1] == "pipeline succeeded alice"

        # 5. Watch and revoke.
        for command in steps[5]:
            if " ID " in command:
                continue
            shown = admin.run(ours(command)).stdout
            assert "alive" in shown or "user:alice" in shown, shown
            if command.startswith("fray token list"):
                assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", shown), shown  # the CLI's one time format
        credentials = json.loads(admin.run(f"fray token list --controller {here}:7100 --json").stdout)
        (alice_id,) = [row["id"] for row in credentials if row["subject"] == "user:alice"]
        revoke_worker = next(c for c in steps[5] if c.startswith("fray worker revoke ID"))
        admin.run(ours(revoke_worker).replace(" ID ", f" {joined['worker_id']} "))
        assert worker.wait(timeout=30) == 2, (tmp_path / "worker.log").read_text()
        revoke_token = next(c for c in steps[5] if c.startswith("fray token revoke ID"))
        admin.run(ours(revoke_token).replace(" ID ", f" {alice_id} "))
        again = alice.run(run_pipeline, check=False)
        # The refusal says why (issue 36): revoked, not merely refused.
        assert again.returncode != 0 and "credential 'user:alice#" in again.stderr, again.stderr[-2000:]
        assert "was revoked" in again.stderr, again.stderr[-2000:]

        # A controller that stops takes its record with it (a later one on that address records its own).
        controller.terminate()
        assert controller.wait(timeout=30) == 0, (tmp_path / "controller.log").read_text()
        assert not (admin.home / ".config" / "fray" / "cas" / f"{here}-7100.pem").is_symlink()
    finally:
        for shell in (alice, worker_machine, admin):
            shell.stop()
