"""The iris:// spec and in-task detection: pure Fray, so these run on every Python."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fray
from backends.iris import iris_installed
from fray.client import detect_spec, parse_client_spec


def test_iris_specs_parse():
    spec = parse_client_spec("iris://controller:10000?workspace=/srv/ws")
    assert (spec.scheme, spec.address, spec.options) == ("iris", "controller:10000", {"workspace": "/srv/ws"})
    assert parse_client_spec("iris").address is None
    with pytest.raises(fray.ConfigError, match="HOST:PORT"):
        parse_client_spec("iris://controller")


def test_an_iris_task_is_detected_from_irises_own_variables(monkeypatch):
    monkeypatch.delenv("IRIS_TASK_ID", raising=False)
    monkeypatch.setenv("IRIS_CONTROLLER_ADDRESS", "http://127.0.0.1:1")
    assert detect_spec() is None
    monkeypatch.setenv("IRIS_TASK_ID", "/alice/job/0:0")
    assert detect_spec() == "iris"


def test_importing_fray_and_finding_no_engine_imports_no_iris():
    code = "import sys, fray; from fray.client import detect_spec; detect_spec(); print('iris' in sys.modules)"
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


if not iris_installed():

    def test_without_iris_the_spec_says_how_to_install_it():
        with pytest.raises(fray.ConfigError, match=r"fray\[iris\]"):
            fray.client_from_spec("iris://127.0.0.1:1")
