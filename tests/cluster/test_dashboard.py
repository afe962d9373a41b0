"""The web dashboard in a real headless Chromium: log in, watch a job appear, follow its output, see it succeed.

Needs Debian's `chromium` (installed by `.ci/run`) and the `playwright` package, which drives the system
browser (no browser download). Without them these tests are skipped, saying why.
"""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fray.cluster.client import ClusterClient
from fray.cluster.controller_client import ops_client
from fray.cluster.launcher import LocalCluster
from fray.job import Entrypoint, JobRequest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Flags that keep Chromium from reaching out to the network this machine does not have.
_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUTPUT_DIR = Path(os.environ.get("FRAY_TEST_OUTPUT", Path(__file__).resolve().parents[2] / "test-output"))


def _dashboard(cluster: LocalCluster) -> str:
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    ops = ops_client(cluster.address, cluster.token)
    try:
        address = ops.health()["dashboard"]
    finally:
        ops.close()
    assert address, "the controller serves a dashboard when the dashboard extra is installed"
    return str(address)


@pytest.fixture
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (apt-get install chromium): the browser test cannot run")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=_FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def _request(address: str, method: str, path: str, body: str = "", headers: dict[str, str] | None = None) -> Any:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


def test_log_in_watch_a_job_run_follow_its_output_and_see_it_succeed(
    fray_cluster: LocalCluster, browser: Any, tmp_path: Path
):
    address = _dashboard(fray_cluster)
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(f"http://{address}/jobs")
    assert "/login" in page.url  # nothing is shown before logging in
    page.fill("input[name=token]", "not-the-token")
    page.click("button[type=submit]")
    assert "not this cluster's token" in page.content()
    page.fill("input[name=token]", fray_cluster.token)
    page.click("button[type=submit]")
    page.wait_for_url(f"http://{address}/jobs")
    cookie = next(c for c in page.context.cookies() if c["name"] == "fray_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    gate = tmp_path / "gate"
    client = ClusterClient(fray_cluster.address, token=fray_cluster.token)
    script = f"echo started; while [ ! -e {gate} ]; do sleep 0.05; done; echo finished"
    job = client.submit(JobRequest(name="dash-demo", entrypoint=Entrypoint.from_binary("bash", ["-c", script])))
    try:
        # The open page learns of the job by itself (server-sent events), without a reload.
        row = page.locator("#jobs tr", has_text=job.job_id)
        row.filter(has_text="running").wait_for(timeout=60_000)
        OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
        shot = OUTPUT_DIR / "dashboard-jobs.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot of the jobs page: {shot}")

        row.locator("a", has_text="logs").click()
        log = page.locator("#log")
        log.filter(has_text="started").wait_for(timeout=60_000)
        assert page.locator("#final").inner_text() == "running"
        gate.touch()
        log.filter(has_text="finished").wait_for(timeout=60_000)
        page.locator("#final", has_text="succeeded").wait_for(timeout=60_000)
        page.screenshot(path=str(OUTPUT_DIR / "dashboard-logs.png"), full_page=True)

        page.goto(f"http://{address}/jobs/{job.job_id}")
        assert "History" in page.content() and "succeeded" in page.locator("table").first.inner_text()
        for path, text in (("/workers", "worker-0"), ("/actors", "Actors"), ("/queues", "<h1>Queues</h1>")):
            page.goto(f"http://{address}{path}")
            assert text in page.content()
    finally:
        gate.touch()
        client.shutdown(wait=False)


def test_one_time_links_and_what_is_refused(fray_cluster: LocalCluster, browser: Any):
    address = _dashboard(fray_cluster)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env.update(FRAY_TOKEN=fray_cluster.token, FRAY_CLIENT_SPEC=f"fray://{fray_cluster.address}")
    printed = subprocess.run([sys.executable, "-m", "fray.cli", "dashboard"], env=env, capture_output=True, text=True)
    assert printed.returncode == 0, printed.stderr
    link = printed.stdout.strip()
    assert link.startswith(f"http://{address}/login?code=")
    page = browser.new_page()
    page.goto(link)
    assert page.url == f"http://{address}/jobs"
    other = browser.new_page()  # a second context would be a second browser; a reused code fails anyway
    other.context.clear_cookies()
    other.goto(link)
    assert "used already or has expired" in other.content()

    # Without a session: pages redirect to the log-in, streams are refused, state changes are refused.
    status, headers, _ = _request(address, "GET", "/jobs")
    assert status == 303 and headers["location"].startswith("/login")
    assert _request(address, "GET", "/stream/jobs")[0] == 401
    assert _request(address, "POST", "/stop/anything")[0] == 303
    # With a session but without the CSRF token (a forged form from another site): refused.
    session = next(c["value"] for c in page.context.cookies() if c["name"] == "fray_session")
    forged = _request(
        address,
        "POST",
        "/stop/anything",
        "csrf=guess",
        {"Cookie": f"fray_session={session}", "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert forged[0] == 403
    # GET never changes anything: there is no GET route that stops a job.
    assert _request(address, "GET", "/stop/anything", headers={"Cookie": f"fray_session={session}"})[0] == 405
    page_status, page_headers, _ = _request(address, "GET", "/jobs", headers={"Cookie": f"fray_session={session}"})
    assert page_status == 200 and "frame-ancestors 'none'" in page_headers["content-security-policy"]
