"""The messages between a sandbox worker process and the executor's slot that owns it.

Each message is a tuple sent over the worker's socket (``multiprocessing.connection``, pickled), whose first
item is a :class:`Msg` and the rest its arguments. ``Msg`` is a ``str`` enum so that a message compares equal
to its bare name (``Msg.GO == "go"``) and its members print as that name: a worker and an executor of the same
checkout pickle and unpickle it by value.

executor -> worker (:data:`TO_WORKER`):

  ``(JOB, payload)``       ``_jobloop``: run this job (the payload dict ``_job.run_job`` reads); answered by RESULT
  ``(GO,)``                ``_jobloop``: the READ or LOCK the worker asked for is granted
  ``(EXIT,)``              ``_slots._Worker.stop``: leave the serve loop and exit

worker -> executor (:data:`TO_EXECUTOR`):

  ``(READY, info)``        ``_worker``: started; ``info`` is the device, versions, memory (read by ``_slots``)
  ``(FAILED, traceback)``  ``_worker.main``: the worker could not start (any first message but READY is a failure)
  ``(PHASE, name)``        the job entered phase ``name``: the executor's deadline is that phase's limit
  ``(READ,)`` / ``(UNREAD,)``  take / give up a shared hold of the GPU (reference, trials, compile); READ waits for GO
  ``(LOCK,)`` / ``(UNLOCK,)``  take / give up the GPU's writer lock (timing); LOCK waits for GO
  ``(REGRANT, need)``      ``Worker.regrant``: the job capped itself at ``need`` bytes; the rest of its grant goes back
  ``(PEAK, bytes)``        ``_job``: the reference's measured peak, before the candidate runs (the probe's waiters go)
  ``(REFERENCE, key, digest)``  ``_reference``: the worker now holds reference outputs ``key`` with this digest,
                           reported before any candidate of the job ran (what a later job's reuse is checked against)
  ``(RESULT, result, restart)``  the job's result dict, and whether the worker exits after it

``tests/sandbox/test_protocol.py`` checks that every message one side sends is one the other side handles, and
that no side sends a bare string.
"""

from __future__ import annotations

import enum


class Msg(str, enum.Enum):
    JOB = "job"
    GO = "go"
    EXIT = "exit"
    READY = "ready"
    FAILED = "failed"
    PHASE = "phase"
    READ = "read"
    UNREAD = "unread"
    LOCK = "lock"
    UNLOCK = "unlock"
    REGRANT = "regrant"
    PEAK = "peak"
    REFERENCE = "reference"
    RESULT = "result"

    def __str__(self) -> str:  # the bare name in messages and error texts, as when these were strings
        return self.value


TO_WORKER = frozenset({Msg.JOB, Msg.GO, Msg.EXIT})
TO_EXECUTOR = frozenset(Msg) - TO_WORKER
