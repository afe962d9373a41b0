"""How the Ray backend reads Ray's text tracebacks and errors (pure functions; no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray", reason='the Ray backend needs Ray: pip install "fray[ray]"')

import fray
from fray.ray._errors import trim_traceback

FRAY_DIR = str(Path(fray.__file__).parent)

# What str() of the RayTaskError(ValueError) raised by ray.get looks like: Ray's own header,
# its internal frames already hidden but their caret lines left behind.
RAY_FORMATTED = """\x1b[36mray::Service.fail()\x1b[39m (pid=16204, ip=192.0.2.2, actor_id=251b, repr=<mod.Service>)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/user/project/mod.py", line 4, in fail
    raise ValueError(message)
    ^^^^^^^^^^^^^^^^^^^^^^^^^
ValueError: bad input"""

# A raw traceback_str of an async method: Ray's frames, then Fray's wrapper, the stdlib's
# future, Fray's event loop glue, and at last the user's code.
RAW_ASYNC = f"""Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/ray/_private/function_manager.py", line 689, in actor_method_executor
    return method(__ray_actor, *args, **kwargs)
  File "/venv/lib/python3.11/site-packages/ray/util/tracing/tracing_helper.py", line 463, in _resume_span
    return method(self, *_args, **_kwargs)
  File "{FRAY_DIR}/ray/_worker.py", line 195, in method
    return self._fray_actor_loop.run(fn(self, *args, **kwargs))
  File "/usr/lib/python3.11/concurrent/futures/_base.py", line 456, in result
    return self.__get_result()
  File "{FRAY_DIR}/_eventloop.py", line 58, in _as_coroutine
    return await awaitable
  File "/home/user/project/mod.py", line 10, in lookup
    return helper(key)
  File "{FRAY_DIR}/job.py", line 7, in helper
    raise KeyError(key)
KeyError: 'k'"""


def test_ray_header_and_leftover_carets_are_dropped() -> None:
    assert trim_traceback(RAY_FORMATTED) == (
        "Traceback (most recent call last):\n"
        '  File "/home/user/project/mod.py", line 4, in fail\n'
        "    raise ValueError(message)\n"
        "    ^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "ValueError: bad input\n"
    )


def test_machinery_above_the_users_code_is_dropped_but_fray_code_it_called_stays() -> None:
    assert trim_traceback(RAW_ASYNC) == (
        "Traceback (most recent call last):\n"
        '  File "/home/user/project/mod.py", line 10, in lookup\n'
        "    return helper(key)\n"
        f'  File "{FRAY_DIR}/job.py", line 7, in helper\n'
        "    raise KeyError(key)\n"
        "KeyError: 'k'\n"
    )


def test_chained_tracebacks_keep_both_parts() -> None:
    text = RAY_FORMATTED + "\n\nDuring handling of the above exception, another exception occurred:\n\n" + RAW_ASYNC
    trimmed = trim_traceback(text)
    assert trimmed.count("Traceback (most recent call last):") == 2
    assert "During handling of the above exception" in trimmed
    assert "ray/_private" not in trimmed and "_worker.py" not in trimmed
