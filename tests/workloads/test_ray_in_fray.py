"""``examples/ray_in_fray.py``: a three-replica fray:// job boots a Ray cluster, runs a Ray program, and leaves nothing.

Runs on the session's Fray cluster (its replicas' Ray nodes are real ``ray start``
processes with their own temp dirs and free ports, apart from the session's Ray). The
example records, by PID, every process each replica's Ray node started; the tests check
those are all gone once the Fray job has ended, normally or terminated. On the local
backend and on Ray the example refuses with a clear error (it is about Fray hosting Ray).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fray import ConfigError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from example_modules import load_example, run_script  # noqa: E402

pytest.importorskip("ray", reason='the example runs Ray: pip install "fray[ray]"')
example = load_example("ray_in_fray")

REPLICAS = 3


def check_processes(result) -> None:
    """Each replica started a raylet, replica 0 the GCS too, and none of them runs any more."""
    names = {(replica, comm) for replica, _, comm in result.ray_processes}
    assert {(r, "raylet") for r in range(REPLICAS)} <= names
    assert (0, "gcs_server") in names
    assert (0, "ray program") in names  # the user's Ray driver
    assert result.still_running == ()
    assert result.temp_dirs and not any(Path(d).exists() for d in result.temp_dirs)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_ray_program_runs_on_the_jobs_own_ray_cluster_and_nothing_is_left(cluster_client, uid, tmp_path):
    result = example.run(cluster_client, tmp_path, name=f"rif-{uid}")
    assert result.fray_status == "succeeded"
    assert result.program["client"] == "RayClient"  # FRAY_CLIENT_SPEC=ray in the user's program
    assert result.program["ray_nodes"] == REPLICAS  # one Ray node per replica of the Fray job
    assert result.program["job_status"] == "succeeded"
    assert result.program["job_output"].startswith("hello from Ray node ")
    check_processes(result)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_terminating_the_fray_job_tears_the_ray_cluster_down(cluster_client, uid, tmp_path):
    result = example.run(cluster_client, tmp_path, name=f"rif-stop-{uid}", terminate_when_running=True)
    assert result.fray_status == "stopped"
    assert result.program["ray_nodes"] == REPLICAS
    check_processes(result)


@pytest.mark.parametrize("backend", ["local_client", "ray_client"])
def test_other_backends_refuse_clearly(backend, request, tmp_path):
    client = request.getfixturevalue(backend)
    with pytest.raises(ConfigError, match=r"runs on fray:// only, not on (LocalClient|RayClient)"):
        example.run(client, tmp_path)


def test_the_example_run_as_a_script_on_the_local_backend_says_it_needs_fray():
    out = run_script("ray_in_fray", timeout=120)
    assert out.returncode == 1
    assert "runs on fray:// only, not on LocalClient" in out.stderr
    assert "FRAY_CLIENT_SPEC=fray://HOST:PORT" in out.stderr
