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
from fray.cluster.protocol.controller_client import ops_client
from fray.cluster.server.launcher import LocalCluster
from fray.job import Entrypoint, JobRequest, JobStatus
from fray.resources import ResourceConfig
from support import wait_until

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

        # A job that allowed no retry and failed once used none (it once read "retries used: 1 failures").
        failed = client.submit(JobRequest(name="dash-fails", entrypoint=Entrypoint.from_binary("false")))
        assert failed.wait(timeout=60, raise_on_failure=False) == JobStatus.FAILED
        page.goto(f"http://{address}/jobs/{failed.job_id}")
        facts = page.locator("table").first.inner_text()
        assert "failures\t1 (0 of 0 retries used)" in facts, facts
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


def test_utilisation_charts_job_timeline_and_pending_reasons(fray_cluster: LocalCluster, browser: Any, tmp_path: Path):
    """A pending job shows its reason in the list; a job that failed once and was retried shows one bar per
    attempt on its timeline; the Utilisation page draws its charts from samples whose numbers match the cluster."""
    address = _dashboard(fray_cluster)
    assert _request(address, "GET", "/data/utilisation")[0] == 401  # the data needs a session too
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"http://{address}/login")
    page.fill("input[name=token]", fray_cluster.token)
    page.click("button[type=submit]")
    page.wait_for_url(f"http://{address}/jobs")

    client = ClusterClient(fray_cluster.address, token=fray_cluster.token)
    marker = tmp_path / "failed-once"
    flaky = f"if [ -e {marker} ]; then echo second; else touch {marker}; echo first; exit 3; fi"
    pending = client.submit(
        JobRequest(
            name="dash-too-big",
            entrypoint=Entrypoint.from_binary("true", []),
            resources=ResourceConfig(cpu=512),
        )
    )
    retried = client.submit(
        JobRequest(
            name="dash-retried",
            entrypoint=Entrypoint.from_binary("bash", ["-c", flaky]),
            max_retries_failure=1,
        )
    )
    gate = tmp_path / "gate"
    busy = client.submit(
        JobRequest(
            name="dash-busy",
            entrypoint=Entrypoint.from_binary("bash", ["-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]),
            resources=ResourceConfig(cpu=2, ram="1g"),
        )
    )
    shots: list[Path] = []
    try:
        assert retried.wait(timeout=120) == JobStatus.SUCCEEDED
        wait_until(lambda: pending.pending_reason() != "", timeout=60)
        reason = pending.pending_reason()

        # The jobs list: the pending job's row carries the scheduler's reason, as `fray job list` does.
        page.goto(f"http://{address}/jobs")
        why = page.locator("#jobs tr", has_text=pending.job_id).locator("td.why")
        why.wait_for(timeout=60_000)
        # (The reason names the largest worker; read it again in case a worker joined meanwhile.)
        assert why.inner_text().strip() in (reason.strip(), pending.pending_reason().strip())
        assert "512 cores" in reason
        shots.append(tmp_path / "dashboard-jobs-pending-reason.png")
        page.screenshot(path=str(shots[-1]), full_page=True)

        # The job page: a timeline with one bar per attempt's task, coloured by how each ended.
        page.goto(f"http://{address}/jobs/{retried.job_id}")
        bars = page.locator("#timeline svg.timeline rect.bar")
        assert bars.count() == 2
        assert [bars.nth(i).get_attribute("data-attempt") for i in range(2)] == ["0", "1"]
        assert [bars.nth(i).get_attribute("data-state") for i in range(2)] == ["failed", "succeeded"]
        for i in range(2):
            box = bars.nth(i).bounding_box()
            assert box is not None and box["width"] >= 1 and box["height"] > 5
        shots.append(tmp_path / "dashboard-job-timeline.png")
        page.screenshot(path=str(shots[-1]), full_page=True)

        # The Utilisation page: its data endpoint's numbers are the cluster's, and each chart is drawn.
        ops = ops_client(fray_cluster.address, fray_cluster.token)
        try:
            capacity = ops.status()["capacity"]
            # The same samples over the operator API (the administrator's view includes jobs by state).
            assert "jobs" in ops.utilisation()["samples"][-1]
        finally:
            ops.close()

        def data() -> dict[str, Any]:
            response = page.request.get(f"http://{address}/data/utilisation")
            assert response.status == 200
            return dict(response.json())

        # Samples are taken every 5 s: wait for two that saw the pending job and the busy one's 2 cores in use.
        def seen_jobs() -> bool:
            charts = {c["id"]: c for c in data()["charts"]}
            pending_counts = charts["jobs"]["series"][0]["values"]
            cores_in_use = charts["cpu"]["series"][0]["values"]
            both = [p >= 1 and c >= 2 for p, c in zip(pending_counts, cores_in_use, strict=True)]
            return sum(both) >= 2

        wait_until(seen_jobs, timeout=90)
        charts = {c["id"]: c for c in data()["charts"]}
        assert busy.status() == JobStatus.RUNNING
        # The busy job's worker shows its 2 cores and 1 GiB in the per-worker charts.
        assert max(v or 0 for s in charts["workers"]["series"] for v in s["values"]) >= 2
        assert max(v or 0 for s in charts["workers_ram"]["series"] for v in s["values"]) >= 1
        assert max(charts["ram"]["series"][0]["values"]) >= 1
        assert set(charts) == {"cpu", "ram", "jobs", "workers", "workers_ram"}
        assert charts["cpu"]["series"][1]["values"][-1] == capacity["cpu_total"]
        assert charts["ram"]["series"][1]["values"][-1] == round(capacity["ram_total"] / (1 << 30), 3)
        assert {"worker-0", "worker-1"} <= {s["label"] for s in charts["workers"]["series"]}

        page.goto(f"http://{address}/utilisation")
        assert f"of {capacity['cpu_total']:g} cores in use" in page.locator("#latest").inner_text()
        page.wait_for_function("Number(document.getElementById('charts').dataset.samples || 0) >= 2", timeout=60_000)
        for name in ("cpu", "ram", "jobs", "workers", "workers_ram"):
            canvas = page.locator(f"#chart-{name} canvas")
            assert canvas.count() == 1
            box = canvas.bounding_box()
            assert box is not None and box["width"] >= 300 and box["height"] >= 100, (name, box)
            assert int(page.locator(f"#chart-{name}").get_attribute("data-points") or 0) >= 2
        # The chart library is served by the dashboard itself, with its licence (no network needed).
        assert page.request.get(f"http://{address}/static/uPlot.LICENSE").text().startswith("The MIT License")
        shots.append(tmp_path / "dashboard-utilisation.png")
        page.screenshot(path=str(shots[-1]), full_page=True)
        # pytest keeps only its last few tmp dirs: a copy goes where the other dashboard screenshots go.
        OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
        kept = [Path(shutil.copy(shot, OUTPUT_DIR / shot.name)) for shot in shots]
        print("screenshots:", *map(str, shots + kept), sep="\n  ")
    finally:
        gate.touch()
        pending.terminate()
        client.shutdown(wait=False)
