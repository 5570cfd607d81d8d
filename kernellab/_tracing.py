"""One lock for every graph trace in a process (torch.export, make_fx, torch.fx symbolic tracing).

Those keep process-wide state: the dispatch-mode stack, ``Module.__call__`` patched for the length of a trace,
and (in the builtin's capture) ``redirect_stderr``. Two threads tracing at once broke each other ("Trying to pop
empty mode stack") and left ``Module.__call__`` replaced, so that every later model call in the process raised
``NameError: module is not installed as a submodule``: ``kernellab optimize`` on the H200, where a campaign's
graph nodes run in threads and each new child's code generation captured the problem. Unpickling an fx
``GraphModule`` traces it again, so executing a problem's source (``problem.execute``: an ``optimize`` subgraph's
problem file loads its graph with ``torch.load``) takes the lock too. A re-entrant lock, since a capture executes
the problem and may trace again inside itself.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from collections.abc import Iterator
from typing import Any

TRACE_LOCK = threading.RLock()


class _ThisThreadMuted:
    """``sys.stderr`` while one thread traces: that thread's writes are dropped, every other thread's reach
    the stream as before (``contextlib.redirect_stderr`` swaps the stream for the whole process, and a 4-job
    bench lost other campaigns' lines printed while one of them captured its graph)."""

    def __init__(self, stream: Any, owner: threading.Thread) -> None:
        self._stream, self._owner, self._sink = stream, owner, io.StringIO()

    def _target(self) -> Any:
        return self._sink if threading.current_thread() is self._owner else self._stream

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Drop what the calling thread writes to ``sys.stderr`` (a trace's chatter), others' writes untouched."""
    was = sys.stderr
    sys.stderr = _ThisThreadMuted(was, threading.current_thread())
    try:
        yield
    finally:
        sys.stderr = was
