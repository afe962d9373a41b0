"""Finding the client: specs, the environment variable, and set_current_client."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from fray import ConfigError, Entrypoint, JobRequest, client_from_spec, current_client, set_current_client
from fray.client import parse_client_spec
from fray.local import LocalClient


def test_default_client_is_local_and_stable(monkeypatch):
    monkeypatch.delenv("FRAY_CLIENT_SPEC", raising=False)
    client = current_client()
    assert isinstance(client, LocalClient)
    assert current_client() is client


def test_a_shut_down_default_client_is_replaced(monkeypatch):
    monkeypatch.delenv("FRAY_CLIENT_SPEC", raising=False)
    first = current_client()
    first.shutdown()
    second = current_client()
    assert second is not first
    assert second.submit(JobRequest(name="after", entrypoint=Entrypoint.from_callable(print))).wait(timeout=30)


def test_spec_from_environment(monkeypatch):
    monkeypatch.setenv("FRAY_CLIENT_SPEC", "local?threads=3")
    client = current_client()
    assert isinstance(client, LocalClient) and client.max_threads == 3


@pytest.mark.parametrize(
    ("text", "scheme", "address", "options"),
    [
        ("local", "local", None, {}),
        ("local?threads=4", "local", None, {"threads": "4"}),
        ("ray", "ray", None, {}),
        ("ray?namespace=team-a", "ray", None, {"namespace": "team-a"}),
        ("ray://head:10001", "ray", "head:10001", {}),
        ("fray://127.0.0.1:7100", "fray", "127.0.0.1:7100", {}),
    ],
)
def test_parse_valid_specs(text, scheme, address, options):
    spec = parse_client_spec(text)
    assert (spec.scheme, spec.address, spec.options) == (scheme, address, options)


@pytest.mark.parametrize(
    "text",
    ["", "nosuch://x:1", "locl", "fray://nohost", "fray://host:notaport", "fray://host:99999", "local?threads"],
)
def test_malformed_specs_list_the_valid_forms(text):
    with pytest.raises(ConfigError) as info:
        parse_client_spec(text)
    assert "local?threads=N" in str(info.value)
    assert isinstance(info.value, ValueError)


def _script(code: str, spec: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAY_")}
    env.update(FRAY_CLIENT_SPEC=spec, **extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_a_script_with_a_malformed_spec_ends_with_one_line() -> None:
    """A script that never catches it: one line naming FRAY_CLIENT_SPEC and the valid forms, exit 1, no traceback."""
    out = _script("import fray\nfray.current_client()", "fary://127.0.0.1:7100")
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("fray: FRAY_CLIENT_SPEC: client spec 'fary://127.0.0.1:7100': unknown backend 'fary'")
    assert "valid forms" in line and "FRAY_DEBUG=1" in line
    # Code may still catch it; another uncaught error keeps its traceback; FRAY_DEBUG=1 shows this one's.
    caught = "import fray\ntry:\n    fray.current_client()\nexcept fray.ConfigError:\n    print('caught')\nraise KeyError('x')"
    out = _script(caught, "fary://x")
    assert out.stdout == "caught\n" and "Traceback" in out.stderr and "KeyError" in out.stderr
    assert "fray: FRAY_CLIENT_SPEC" not in out.stderr
    out = _script("import fray\nfray.current_client()", "fary://x", FRAY_DEBUG="1")
    assert out.returncode == 1 and "Traceback" in out.stderr and "ConfigError" in out.stderr


@pytest.mark.parametrize("text", ["local?threads=0", "local?threads=x", "local?workers=2", "local://h:1"])
def test_bad_local_options(text):
    with pytest.raises(ConfigError) as info:
        client_from_spec(text)
    assert "valid forms" in str(info.value)


def test_set_current_client_restores_even_when_the_block_raises():
    outer = current_client()
    inner = LocalClient()
    with pytest.raises(RuntimeError), set_current_client(inner):
        assert current_client() is inner
        raise RuntimeError("boom")
    assert current_client() is outer
    inner.shutdown()


def test_set_current_client_is_per_thread_context():
    mine = LocalClient()
    seen = []
    with set_current_client(mine):
        thread = threading.Thread(target=lambda: seen.append(current_client()))
        thread.start()
        thread.join()
    assert seen and seen[0] is not mine
    mine.shutdown()


def test_set_current_client_rejects_non_clients():
    with pytest.raises(ConfigError), set_current_client("local"):  # type: ignore[arg-type]
        pass


def _which_client(out: list) -> None:
    out.append(current_client())


def test_jobs_see_the_client_that_runs_them():
    client = LocalClient()
    out: list = []
    client.submit(JobRequest(name="which", entrypoint=Entrypoint.from_callable(_which_client, args=(out,)))).wait(
        timeout=30
    )
    assert out == [client]
    client.shutdown()
