"""The README's demo command keeps working."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quickstart_runs_on_the_local_backend():
    env = {k: v for k, v in os.environ.items() if k != "FRAY_CLIENT_SPEC"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "backend: LocalClient" in out.stdout
    assert "tokenize" in out.stdout and "=succeeded" in out.stdout
    assert out.stdout.count("replica 3/4") == 1  # echoed live once; logs() is counted, not printed again
    assert "job.logs() holds 4 lines" in out.stdout
    assert "from 3 scorers" in out.stdout
    assert "scorer statuses after shutdown: ['stopped', 'stopped', 'stopped']" in out.stdout
    assert "a job that fails on purpose" in out.stdout
    assert "cause: ValueError('shard 17 has a corrupt header')  (intended: the demo ends here)" in out.stdout


def test_every_example_answers_help_at_once():
    """``python examples/X.py --help`` says what the example does and runs nothing (argparse's or the docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "FRAY_CLIENT_SPEC"}
    examples = sorted(p for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_"))
    assert len(examples) >= 7
    for example in examples:
        out = subprocess.run(
            [sys.executable, str(example), "--help"], capture_output=True, text=True, timeout=60, env=env
        )
        assert out.returncode == 0, f"{example.name} --help: {out.stderr}"
        doc = ast.get_docstring(ast.parse(example.read_text())) or ""
        # argparse's usage, or the docstring: nothing the example prints when it runs comes first.
        assert out.stdout.startswith(("usage:", doc.splitlines()[0])), f"{example.name} --help: {out.stdout[:300]}"
