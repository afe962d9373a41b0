"""The ``fray`` command line."""

from __future__ import annotations

import json

from click.testing import CliRunner

import fray
from fray.cli import main


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and fray.__version__ in result.output


def test_info_reports_the_spec_and_flags_a_bad_one(monkeypatch):
    monkeypatch.setenv("FRAY_CLIENT_SPEC", "local?threads=2")
    data = json.loads(CliRunner().invoke(main, ["info", "--json"]).output)
    assert data["spec"] == "local?threads=2" and data["problem"] == ""
    monkeypatch.setenv("FRAY_CLIENT_SPEC", "bogus://x")
    data = json.loads(CliRunner().invoke(main, ["info", "--json"]).output)
    assert "unknown backend" in data["problem"]
