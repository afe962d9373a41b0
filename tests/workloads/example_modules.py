"""Examples in tests: ``load_example(NAME)`` imports ``examples/NAME.py``; ``run_script`` runs it as a user would."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import cloudpickle

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    """Import ``examples/NAME.py`` (once) and have cloudpickle send its functions and classes by value."""
    module_name = f"fray_example_{name}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None, f"no example {name}"
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        cloudpickle.register_pickle_by_value(module)
        try:  # Ray pickles actor classes with its own copy of cloudpickle, which keeps its own list
            import ray.cloudpickle
        except ImportError:
            pass
        else:
            ray.cloudpickle.register_pickle_by_value(module)
    return module


def run_script(
    name: str, *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python examples/NAME.py ARGS`` on the local backend (no ``FRAY_CLIENT_SPEC``), as a user would run it."""
    env = {k: v for k, v in os.environ.items() if k != "FRAY_CLIENT_SPEC"}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
