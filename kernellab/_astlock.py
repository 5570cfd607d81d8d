"""``ast.parse`` serialized across the threads of one process.

CPython keeps the AST converter's recursion depth in per-interpreter state, so two threads converting at
the same time (a garbage collection inside one conversion can switch threads) can fail with ``SystemError:
AST constructor recursion depth mismatch`` (python/cpython#106905 and its reports). LangGraph runs a
campaign's graph nodes in threads, and several of them parse candidate sources: the CPU search test hit it
on Python 3.11.7. kernellab parses only in its own process this way (the sandbox workers are separate
processes), so one re-entrant lock around ``ast.parse`` removes the race at a cost too small to measure."""

from __future__ import annotations

import ast
import threading

_LOCK = threading.RLock()
_parse = ast.parse


def parse(*args, **kwargs):
    with _LOCK:
        return _parse(*args, **kwargs)


parse.__doc__ = _parse.__doc__
parse.__wrapped__ = _parse


def install() -> None:
    """Make ``ast.parse`` the serialized one, once per process (every caller, ours or a library's, shares the
    converter's state, so every caller takes the lock)."""
    if ast.parse is not parse:
        ast.parse = parse
