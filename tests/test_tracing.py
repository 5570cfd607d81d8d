"""kernellab._tracing.quiet_stderr: a trace's chatter dropped, other threads' output kept."""

from __future__ import annotations

import io
import sys
import threading

from kernellab._tracing import quiet_stderr


def test_quiet_stderr_drops_only_the_tracing_threads_writes(monkeypatch):
    real = io.StringIO()
    monkeypatch.setattr(sys, "stderr", real)
    inside, printed = threading.Event(), threading.Event()

    def other() -> None:  # another campaign's progress line, while the first one captures its graph
        inside.wait(5)
        print("bench: 2/4 done", file=sys.stderr)
        printed.set()

    t = threading.Thread(target=other)
    t.start()
    with quiet_stderr():
        print("torch.export chatter", file=sys.stderr)
        inside.set()
        assert printed.wait(5)
    t.join(5)
    assert sys.stderr is real
    assert real.getvalue() == "bench: 2/4 done\n"  # contextlib.redirect_stderr swallowed it with the chatter
