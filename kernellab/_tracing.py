"""One lock for every graph trace in a process (torch.export, make_fx, torch.fx symbolic tracing).

Those keep process-wide state: the dispatch-mode stack, ``Module.__call__`` patched for the length of a trace,
and (in the builtin's capture) ``redirect_stderr``. Two threads tracing at once broke each other ("Trying to pop
empty mode stack") and left ``Module.__call__`` replaced, so that every later model call in the process raised
``NameError: module is not installed as a submodule``: ``kernellab optimize`` on the H200, where a campaign's
graph nodes run in threads and each new child's code generation captured the problem. Unpickling an fx
``GraphModule`` traces it again, so executing a problem's source (``small.execute``: an ``optimize`` subgraph's
problem file loads its graph with ``torch.load``) takes the lock too. A re-entrant lock, since a capture executes
the problem and may trace again inside itself.
"""

from __future__ import annotations

import threading

TRACE_LOCK = threading.RLock()
