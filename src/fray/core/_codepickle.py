"""Pickling the user's code by value without losing where it came from.

cloudpickle ships a function it cannot import by name (defined in ``__main__``, in a
notebook, inside another function) as its code object, and renames that code's file
``<dynamic-code>``. A traceback raised in another process then reads ``File
"<dynamic-code>", line 10, in boom``: no file, no source line, where the local backend
shows both. :func:`dumps` pickles as cloudpickle does but keeps each code object's file
name, and carries the lines of that file, which the receiving process registers with
:mod:`linecache` when the file is not there (another host, another container) -- so a
remote traceback reads as a local one. Every backend pickles the user's callables, actor
classes and task functions through it; loading needs nothing but ``pickle.loads``.
"""

from __future__ import annotations

import io
import itertools
import linecache
import os
import pickle
import types
from collections import ChainMap
from collections.abc import Callable
from typing import Any

import cloudpickle

__all__ = ["dumps"]

_DYNAMIC = "<dynamic-code>"
# cloudpickle's own reducer for code objects: its argument order follows the interpreter's.
_code_reduce: Callable[[types.CodeType], tuple[Any, tuple[Any, ...]]] | None = getattr(
    getattr(cloudpickle, "cloudpickle", None), "_code_reduce", None
)


def _code(filename: str, lines: list[str], args: tuple[Any, ...]) -> types.CodeType:
    """Rebuild a code object; make its lines known here if its file is not (merged with other code's)."""
    if lines and not os.path.exists(filename):
        known: Any = linecache.cache.get(filename)  # typeshed also allows a lazy loader's 1-tuple
        if known is None or (len(known) == 4 and known[1] is None):  # nothing, or lines that came this way
            have = known[2] if known is not None else []
            merged = [mine or theirs for mine, theirs in itertools.zip_longest(lines, have, fillvalue="")]
            # mtime None: linecache.checkcache keeps the entry (it cannot be compared with a file).
            linecache.cache[filename] = (sum(map(len, merged)), None, merged, filename)
    return types.CodeType(*args)


def _own_lines(code: types.CodeType) -> list[str]:
    """The lines of ``code``'s file, blank outside ``code`` itself: a job carries its code, not its whole script."""
    lines = linecache.getlines(code.co_filename)
    numbers = [number for _, _, number in code.co_lines() if number is not None]
    first, last = code.co_firstlineno, max(numbers, default=code.co_firstlineno)
    # A blank line pickles as a reference to the one empty string: ~2 bytes per line of the file.
    return [line if first <= number <= last else "" for number, line in enumerate(lines, 1)]


def _reduce_code(code: types.CodeType) -> tuple[Any, tuple[Any, ...]]:
    assert _code_reduce is not None
    constructor, args = _code_reduce(code)
    filename = code.co_filename
    if filename.startswith("<"):  # <stdin>, <string>: no file to name
        return constructor, args
    args = tuple(filename if type(arg) is str and arg == _DYNAMIC else arg for arg in args)
    return _code, (filename, _own_lines(code), args)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any, protocol: int = pickle.HIGHEST_PROTOCOL) -> bytes:
    """``cloudpickle.dumps(obj)``, keeping the file names and source lines of code pickled by value."""
    if _code_reduce is None:  # a cloudpickle without that reducer: its own names, still correct
        return bytes(cloudpickle.dumps(obj, protocol=protocol))
    with io.BytesIO() as file:
        _Pickler(file, protocol=protocol).dump(obj)
        return file.getvalue()
