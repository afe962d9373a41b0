"""What the examples need beyond Fray itself: a missing one is named in one line, with the extra that installs it.

Run as scripts, the examples import this module from their own directory (Python puts a
script's directory first on ``sys.path``); the extras are declared in ``pyproject.toml``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["answer_help", "require"]


def require(module: str, extra: str) -> None:
    """Exit with ``SCRIPT needs MODULE: pip install "fray[EXTRA]"`` unless ``module`` can be imported."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing, or an import hook refuses the module
        found = False
    if not found:
        sys.exit(f'{Path(sys.argv[0]).name} needs {module}: pip install "fray[{extra}]"')


def answer_help(doc: str | None) -> None:
    """With ``-h`` or ``--help`` among the arguments, print the example's docstring and exit; else return."""
    if not {"-h", "--help"} & set(sys.argv[1:]):
        return
    print((doc or "").strip())
    print("\nThe backend is FRAY_CLIENT_SPEC's (local when unset): e.g. FRAY_CLIENT_SPEC=fray://HOST:PORT.")
    sys.exit(0)
