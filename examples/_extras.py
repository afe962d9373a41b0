"""What the examples need beyond Fray itself: a missing one is named in one line, with the extra that installs it.

Run as scripts, the examples import this module from their own directory (Python puts a
script's directory first on ``sys.path``); the extras are declared in ``pyproject.toml``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["require"]


def require(module: str, extra: str) -> None:
    """Exit with ``SCRIPT needs MODULE: pip install "fray[EXTRA]"`` unless ``module`` can be imported."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing, or an import hook refuses the module
        found = False
    if not found:
        sys.exit(f'{Path(sys.argv[0]).name} needs {module}: pip install "fray[{extra}]"')
