"""Stopping on SIGINT or SIGTERM within 10 s, every finished evaluation saved, no campaign left running.

The pieces, each used where the work is:

- :class:`Stopped` -- what a campaign thread sees once the stop is given: a ``KeyboardInterrupt``, so that
  ``except Exception`` handlers that turn an executor failure into a crash result never record the stop as a
  candidate's verdict, and the handlers of Ctrl-C treat it as one;
- :class:`Guarded` -- an executor whose futures raise :class:`Stopped` once the stop is given, instead of
  the ``crash`` results of the workers the shutdown killed (a killed trial is not the candidate's fault);
- :func:`install` (the CLI's): SIGTERM handled like SIGINT; on the first signal the stop is given, every
  :func:`watch`-ed executor is shut down without waiting (its workers killed), and a watchdog marks this
  process's running campaigns stopped and ends the process if it is still alive after ``LIMIT_S``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import signal
import sys
import threading
import weakref
from typing import Any

# the bound of the contract is 10 s: the watchdog ends the process a little before it
LIMIT_S = 8.0
# how long a bench's main thread waits for its campaign threads to see the stop and mark themselves
WAIT_S = 4.0

STOP = threading.Event()  # given once per process, by a signal (the process is ending)
_watched: weakref.WeakSet = weakref.WeakSet()
_installed = False


class Stopped(KeyboardInterrupt):
    """The command was told to stop (SIGINT, SIGTERM): the campaign is saved, resumable, and no result
    that arrives after the stop is recorded."""


def stopping(event: threading.Event | None = None) -> bool:
    return STOP.is_set() or (event is not None and event.is_set())


def watch(executor: Any) -> Any:
    """Register ``executor`` to be shut down (workers killed, nothing waited for) on a signal; returns it."""
    if executor is not None:
        _watched.add(executor)
    return executor


def _stop_all() -> None:
    for g in list(_guards):
        with contextlib.suppress(Exception):  # the stop must go on: one failing leaves the others to stop
            g.stop()
    for ex in list(_watched):
        with contextlib.suppress(Exception):
            ex.shutdown(wait=False)


_guards: weakref.WeakSet = weakref.WeakSet()


class Guarded:
    """``executor`` for a campaign: once :meth:`stop` is called (or a signal gave the process's
    :data:`STOP`), ``submit`` raises :class:`Stopped` and so does every future it returned that had no result
    yet -- at once, not when the sandbox gets round to failing the killed job. Everything else is the
    executor's own."""

    def __init__(self, executor: Any, event: threading.Event | None = None):
        self.inner = executor
        self.event = event if event is not None else threading.Event()
        self._pending: set[cf.Future] = set()
        self._lock = threading.Lock()
        _guards.add(self)

    def stop(self) -> None:
        """Give the stop, fail the futures in flight with :class:`Stopped`, then shut the executor down
        without waiting (its workers are killed; the event is set first, so no killed result gets through)."""
        self.event.set()
        with self._lock:
            pending, self._pending = list(self._pending), set()
        for out in pending:
            with contextlib.suppress(cf.InvalidStateError):
                out.set_exception(Stopped("stopped: the job's worker was killed"))
        self.inner.shutdown(wait=False)

    def submit(self, job: Any) -> cf.Future:
        if stopping(self.event):
            raise Stopped("stopped: no new job is started")
        out: cf.Future = cf.Future()
        out.set_running_or_notify_cancel()
        with self._lock:
            self._pending.add(out)
        inner = self.inner.submit(job)

        def done(f: cf.Future) -> None:
            with self._lock:
                self._pending.discard(out)
            with contextlib.suppress(cf.InvalidStateError):  # stop() failed it already
                if stopping(self.event):
                    out.set_exception(Stopped("stopped: the job's worker was killed"))
                elif f.exception() is not None:
                    out.set_exception(f.exception())
                else:
                    out.set_result(f.result())

        inner.add_done_callback(done)
        return out

    def exclusive_gpu(self, *args: Any, **kwargs: Any):
        return self._profile_hold(self.inner.exclusive_gpu(*args, **kwargs))

    def profiling(self, *args: Any, **kwargs: Any):
        return self._profile_hold(self.inner.profiling(*args, **kwargs))

    @contextlib.contextmanager
    def _profile_hold(self, hold: Any):
        # a profile waiting for the GPU's lock gets it when the killed timing job lets go: it must not start
        if stopping(self.event):
            raise Stopped("stopped: no profile is started")
        with hold as got:
            if stopping(self.event):
                raise Stopped("stopped: no profile is started")
            yield got

    def shutdown(self, wait: bool = True) -> None:
        self.inner.shutdown(wait=wait)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, pickle): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)


def unwrap(executor: Any) -> Any:
    """The executor under any :class:`Guarded` (for checks of its kind)."""
    while isinstance(executor, Guarded):
        executor = executor.inner
    return executor


def guard(executor: Any) -> Guarded:
    """``executor`` guarded, once (a bench hands its campaigns a guarded one already)."""
    return executor if isinstance(executor, Guarded) else Guarded(executor)


# -- the CLI's signal handling ----------------------------------------------------------------------
def install() -> None:
    """SIGINT and SIGTERM: the first gives the stop and raises ``KeyboardInterrupt`` in the main thread (as
    Ctrl-C does by default); later ones are ignored while the stop runs its course. From the main thread only.
    A signal the process was started with ignored stays ignored (``nohup``, a background job of a script)."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _on_signal)
    _installed = True


def _on_signal(signum: int, frame: Any) -> None:
    if STOP.is_set():
        return
    STOP.set()
    # not in the handler itself: the main thread may hold a lock the shutdown needs
    threading.Thread(target=_stop_all, name="kernellab-stop", daemon=True).start()
    threading.Thread(target=_watchdog, name="kernellab-stop-watchdog", daemon=True).start()
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


@contextlib.contextmanager
def deferred():
    """Signals ignored while a stop saves its work (a second Ctrl-C must not cut the saving short; the
    watchdog still bounds it). In the main thread only; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in before:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _watchdog() -> None:
    """A campaign thread stuck in work that no shutdown reaches (an LLM call, torch.compile in this process)
    must not hold the process past the bound: mark the campaigns stopped and end it."""
    if threading.Event().wait(LIMIT_S):  # pragma: no cover - never set
        return
    # what follows (the store's writes, the workers' kill) may itself wait on a busy machine: the bound holds anyway
    hard = threading.Timer(LIMIT_S * 0.2, os._exit, args=(1,))
    hard.daemon = True
    hard.start()
    from kernellab.campaign import mark_stopped_here

    try:
        mark_stopped_here("stopped by a signal; the process was ended before the campaign's thread finished")
    finally:
        exit_now(1)


def exit_now(code: int) -> None:
    """End the process with ``code``: normally when only daemon threads are left, else at once (a non-daemon
    thread still running would hold the interpreter's exit for as long as its work takes)."""
    _stop_all()  # no worker outlives us (they also leave once orphaned, but not at once)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    others = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon and t.is_alive()]
    # only after a signal: a KeyboardInterrupt raised by a caller in-process (a test) must not end the process
    if STOP.is_set() and (others or threading.current_thread() is not threading.main_thread()):
        os._exit(code)
    sys.exit(code)


__all__ = ["Stopped", "Guarded", "STOP", "LIMIT_S", "WAIT_S", "install", "watch", "guard", "unwrap", "stopping",
           "deferred", "exit_now"]
