"""Code pickled by value keeps its file name and its own source lines, wherever it is unpickled."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import cloudpickle

from fray.core._codepickle import dumps

MODULE = textwrap.dedent(
    """
    UNRELATED = "a line of the script that no job needs"


    def inner(value):
        raise ValueError(f"bad {value}")  # inner's line


    def outer(value):
        inner(value + 1)  # outer's line
    """
)

LOAD_AND_CALL = textwrap.dedent(
    """
    import pickle, sys, traceback
    with open(sys.argv[1], "rb") as file:
        fn = pickle.load(file)
    try:
        fn(1)
    except ValueError:
        traceback.print_exc()
    """
)


def test_a_traceback_elsewhere_names_the_file_and_shows_the_lines(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("user_script", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["user_script"] = module
    try:
        spec.loader.exec_module(module)
        cloudpickle.register_pickle_by_value(module)  # as for a script's __main__: shipped as code
        blob = dumps(module.outer)
        cloudpickle.unregister_pickle_by_value(module)
    finally:
        del sys.modules["user_script"]
    assert b"a line of the script that no job needs" not in blob  # only the code's own lines travel
    script.unlink()  # another host: the file is not there
    pickled = tmp_path / "fn.pkl"
    pickled.write_bytes(blob)
    out = subprocess.run(
        [sys.executable, "-c", LOAD_AND_CALL, str(pickled)], capture_output=True, text=True, timeout=60
    )
    assert f'File "{script}", line 10, in outer' in out.stderr, out.stderr
    assert "inner(value + 1)  # outer's line" in out.stderr, out.stderr
    assert f'File "{script}", line 6, in inner' in out.stderr, out.stderr
    assert 'raise ValueError(f"bad {value}")  # inner\'s line' in out.stderr, out.stderr
