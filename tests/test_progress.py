"""Progress bars: drawn on a terminal, silent when stderr is not one."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import threading
    import time
    import fray

    class Server:
        def __init__(self, gate):
            threading.Event().wait(gate)
        def ping(self):
            return "pong"

    client = fray.current_client()
    jobs = [
        client.submit(fray.JobRequest(name=f"j{i}", entrypoint=fray.Entrypoint.from_callable(time.sleep, args=(0.3 * i,))))
        for i in range(4)
    ]
    print(fray.wait_all(jobs, timeout=120, progress=True))
    group = client.create_actor_group(Server, 0.5, name="srv", count=2)
    print(len(group.wait_ready(timeout=120, progress=True)))
    client.shutdown()
    """
)


def _run(stderr_is_tty: bool) -> tuple[str, str]:
    env = {**os.environ, "FRAY_CLIENT_SPEC": "local", "COLUMNS": "100"}
    if not stderr_is_tty:
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout, out.stderr
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=terminal, stdin=subprocess.DEVNULL
    )
    os.close(terminal)
    chunks = []
    while True:
        ready, _, _ = select.select([controller], [], [], 120)
        if not ready:
            break
        try:
            data = os.read(controller, 65536)
        except OSError:  # the child closed its end: EOF on a pty
            break
        if not data:
            break
        chunks.append(data)
    os.close(controller)
    stdout = proc.stdout.read().decode() if proc.stdout else ""
    assert proc.wait(timeout=120) == 0
    return stdout, b"".join(chunks).decode(errors="replace")


def test_progress_bars_on_a_terminal():
    stdout, terminal = _run(stderr_is_tty=True)
    assert "succeeded" in stdout and stdout.strip().endswith("2")
    assert "jobs finished" in terminal and "/4" in terminal
    assert "actors ready" in terminal and "/2" in terminal


def test_no_progress_output_when_not_a_terminal():
    stdout, stderr = _run(stderr_is_tty=False)
    assert "succeeded" in stdout
    assert stderr == ""
