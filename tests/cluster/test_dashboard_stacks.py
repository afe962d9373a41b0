"""The dashboard's "Stacks" buttons (issue 35): on a running job's page and on each running actor's row.

In the headless Chromium of tests/cluster/test_dashboard.py (skipped, saying why, without it): a click
fetches ``/data/stacks/JOB`` and shows every replica's stack under the button; the JSON endpoint
needs a session like every data route.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from cluster.test_dashboard import _dashboard, _request, browser  # noqa: F401 - browser is a fixture
from fray import ActorConfig
from fray.cluster.client import ClusterClient
from fray.cluster.server.launcher import LocalCluster
from fray.job import Entrypoint, JobRequest
from support import wait_until


def dash_sleep(stop: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not Path(stop).exists():
        time.sleep(0.05)


class DashStuck:
    def __init__(self) -> None:
        self.event = threading.Event()

    def block(self) -> None:
        dash_stuck_here(self.event)

    def release(self) -> None:
        self.event.set()


def dash_stuck_here(event: threading.Event) -> None:
    event.wait(120)


def _answered(out: Any) -> str:
    """The text the button put in ``out`` once the answer came (the page's CSP forbids evaluated waits)."""
    return str(
        wait_until(
            lambda: (text := out.text_content() or "") and not text.startswith("asking") and text,
            timeout=30,
            what="the stacks to come",
        )
    )


def test_stacks_buttons_show_a_jobs_replicas_and_an_actors_call(
    fray_cluster: LocalCluster,
    browser: Any,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
):
    address = _dashboard(fray_cluster)
    assert _request(address, "GET", "/data/stacks/anything")[0] == 401  # no session, no stacks

    client = ClusterClient(fray_cluster.address, token=fray_cluster.token)
    stop = tmp_path / "stop"
    job = client.submit(
        JobRequest(name="dash-stacks", entrypoint=Entrypoint.from_callable(dash_sleep, args=(str(stop),)), replicas=2)
    )
    actor = client.create_actor(DashStuck, name="dash-stuck", actor_config=ActorConfig(max_concurrency=2))
    call = actor.block.remote()
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(f"http://{address}/login")
        page.fill("input[name=token]", fray_cluster.token)
        page.click("button[type=submit]")
        page.wait_for_url(f"http://{address}/jobs")

        deadline = time.monotonic() + 60
        while True:  # the button is on the page of a running job only: reload until the job runs
            page.goto(f"http://{address}/jobs/{job.job_id}")
            if page.locator("button.stacks").count() or time.monotonic() > deadline:
                break
            page.wait_for_timeout(200)
        stacks = page.locator("#stacks")
        for _ in range(60):  # both replicas may take a moment to reach deep sleep after the job runs
            page.click("button.stacks >> nth=0")
            text = _answered(stacks)
            if "replica 0" in text and "replica 1" in text and text.count("in dash_sleep") == 2:
                break
            page.wait_for_timeout(500)
        assert "replica 0" in text and "replica 1" in text and text.count("in dash_sleep") == 2, text

        page.goto(f"http://{address}/actors")
        row = page.locator("tr", has_text="dash-stuck")
        for _ in range(60):
            row.locator("button.stacks >> nth=0").click()
            out = row.locator("pre.stacks")
            text = _answered(out)
            if "in dash_stuck_here" in text:
                break
            page.wait_for_timeout(500)
        assert "in dash_stuck_here" in text, text
    finally:
        stop.touch()
        actor.release()
        call.result(timeout=60)
        job.terminate()
        client.shutdown(wait=False)
