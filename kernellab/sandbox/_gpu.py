"""Sharing one GPU between sandbox jobs: a reader/writer lock for measurement and a memory budget.

- :class:`RWLock`: timing and profiling take it as *writer* (the GPU to themselves), correctness work
  (reference, poison, trials, the candidate's calls) as *reader* (shared). Phase-fair with bounded
  write phases: once a writer waits, new readers wait behind it, so a timing never starves behind a
  stream of trials; the writers waiting then go one after another for up to ``WRITE_PHASE_S``, and
  then the readers that waited meanwhile go before the next writer, so correctness work is never
  starved by a queue of timings either (unbounded writer preference kept readers waiting while
  timing after timing went by: 10-18 s of ``wait_read`` per job in a 4-job bench on the H200; one
  writer per phase made every timing wait for the longest read in flight, 1047 s of ``wait_read``
  over 82 evaluations in an 8-job bench). A *long* read (``acquire_read(long=True)``: a gated process's share,
  which under ncu holds it 8-10 s for a few milliseconds of kernels) does not hold back the short reads behind
  a waiting writer: while one is in flight the writer waits for it anyway, so short readers go beside it, and
  once the last long read ends they queue again, so the writer waits at most for the reads that started
  before then (half of an 8-job bench on the H200 was such a drain, the GPU 14-28% busy in it).
- :class:`MemoryBudget`: jobs are admitted against a byte budget (the device's memory minus a
  margin), each with the grant its estimated need asks for, as many at once as fit. A job whose need
  is unknown, or above the whole budget (the estimate is generous), runs alone
  (:meth:`MemoryBudget.why_alone` says which); only one whose *floor* -- what the reference itself
  holds -- exceeds the budget is refused, so every problem whose reference fits the device alone is
  evaluated. Admission is first come, first served with bounded backfill: a job that fits now may
  pass jobs waiting for more memory, each of which it passes at most ``MAX_BYPASS`` times, so a
  large job is never starved and small ones do not queue behind it on a nearly empty card (the old
  rule, alone above half the budget and strict order, kept a 141 GB H200 at 9.8 GB in use).
- :func:`retry_admission`: how a job that ran out of memory (or met a bug of ours) is admitted again.
- :func:`estimate`: a job's footprint and floor from the problem itself, built on the meta device
  (parameters, one trial's inputs and outputs: no memory, no kernels).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from kernellab.vocab import OOM_CLASSES

GIB = 1 << 30
# A write phase of the RWLock: writers that wait when one releases go next, one at a time, until the phase
# has lasted this long; then the readers that waited have their turn. Each switch from readers to a writer
# waits for the longest read in flight to end, so taking the waiting timings together saves a drain each.
WRITE_PHASE_S = 4.0
# Poison written before a candidate call: at most this much (or the job's own size, if smaller).
POISON_CAP = GIB
# Fixed extra per job: the L2 flush buffer, cuBLAS/cuDNN workspaces, allocator rounding.
JOB_OVERHEAD = 256 << 20
# Elements of one input the input fingerprint (sandbox._reference) widens to int64 at a time; it holds three
# such int64 temporaries (the bits, the position weights, their product): 24 bytes per element.
FP_CHUNK = 1 << 22


class RWLock:
    """A phase-fair reader/writer lock (``threading`` only: the executor's slot threads hold it on
    behalf of their workers): readers and writers alternate when both wait (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._long = 0  # long reads in flight (acquire_read(long=True))
        self._writer = False
        self._writers_waiting = 0
        self._readers_waiting = 0
        # readers let in ahead of waiting writers: those that waited while the last write phase held the lock
        self._pass = 0
        self._phase_end: float | None = None  # when the current write phase stops taking further writers
        # writers go in the order they came (a ticket each): two waiting timings raced for the lock otherwise
        self._tickets = 0
        self._serving = 0
        self._abandoned: set[int] = set()

    def acquire_read(self, long: bool = False) -> None:
        """A shared hold. ``long``: one that lasts seconds with the GPU mostly idle (a gated process's share);
        release it with ``release_read(long=True)``."""
        with self._cond:
            self._readers_waiting += 1
            try:
                # a short read passes a waiting writer while a long one is in flight: the writer waits for that
                while self._writer or (self._writers_waiting and not self._pass and (long or not self._long)):
                    self._cond.wait()
            finally:
                self._readers_waiting -= 1
                if not self._readers_waiting:  # passes nobody is left to take (an interrupted wait)
                    self._pass = min(self._pass, 1)
            if self._pass:
                self._pass -= 1
            self._readers += 1
            self._long += long

    def release_read(self, long: bool = False) -> None:
        with self._cond:
            if self._readers <= 0 or self._long < long:
                raise RuntimeError("release_read without a reader")
            self._readers -= 1
            self._long -= long
            if self._readers == 0:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        with self._cond:
            ticket = self._tickets
            self._tickets += 1
            self._writers_waiting += 1
            got = False
            try:
                while (self._writer or self._readers or (self._pass and self._readers_waiting)
                       or ticket != self._serving):
                    self._cond.wait()
                got = True
            finally:
                self._writers_waiting -= 1
                if not got:  # an interrupted wait: the writers after it must not wait for its turn
                    self._abandoned.add(ticket)
                    self._skip_abandoned()
                    self._cond.notify_all()
            self._writer = True
            if self._phase_end is None:
                self._phase_end = time.monotonic() + WRITE_PHASE_S

    def release_write(self) -> None:
        with self._cond:
            if not self._writer:
                raise RuntimeError("release_write without the writer")
            self._writer = False
            self._serving += 1
            self._skip_abandoned()
            if self._writers_waiting and self._phase_end is not None and time.monotonic() < self._phase_end:
                self._pass = 0  # the phase goes on: the next waiting writer, the readers still after it
            else:
                self._pass = self._readers_waiting
                self._phase_end = None
            self._cond.notify_all()

    def _skip_abandoned(self) -> None:
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        self.acquire_read()
        try:
            yield
        finally:
            self.release_read()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        self.acquire_write()
        try:
            yield
        finally:
            self.release_write()

    @property
    def long_reads(self) -> int:
        with self._cond:
            return self._long

    @property
    def state(self) -> tuple[int, bool, int]:
        """(readers, writer held, writers waiting): for tests and diagnostics."""
        with self._cond:
            return self._readers, self._writer, self._writers_waiting

    def held(self) -> str:
        """What the GPU is held for now, as a sampler files its utilization (:class:`kernellab._busy.BusySampler`):
        "alone" (a writer: timing, an ncu replay), "drain" (a writer waits for the readers in flight, the readers
        after it wait), "shared" (readers only), "none" (nothing holds it: every job is on the host or waiting)."""
        with self._cond:
            if self._writer:
                return "alone"
            if self._readers:
                return "drain" if self._writers_waiting else "shared"
            return "none"


class Board:
    """What each thread of an executor is doing for its GPU work now (a slot's job phase, its wait for memory,
    a profile's gated run), keyed by the thread: sampled with the GPU's utilization, it says which phases the
    GPU's idle time sits behind. Lock-free writes (one dict item per thread); a sample copies the values."""

    def __init__(self) -> None:
        self._doing: dict[int, str] = {}

    def set(self, label: str | None) -> None:  # a Phase (kernellab.sandbox._protocol)
        key = threading.get_ident()
        if label is None:
            self._doing.pop(key, None)
        else:
            self._doing[key] = label

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for label in map(str, list(self._doing.values())):  # a Phase's plain name: gpu_state is sampled to JSON
            out[label] = out.get(label, 0) + 1
        return out


class TooBig(Exception):
    """A job needs more memory than the whole budget of its device."""


class MemoryBudget:
    """Admission of jobs to one device against ``budget`` bytes (see the module docstring)."""

    def __init__(self, budget: int, max_bypass: int | None = None) -> None:
        self.budget = int(budget)
        self.used = 0
        self.jobs = 0
        self.max_bypass = MAX_BYPASS if max_bypass is None else int(max_bypass)
        self._cond = threading.Condition()
        self._queue: list[_Ticket] = []

    def grant_for(self, need: int | None) -> tuple[int, bool]:
        """(bytes granted, alone): an unknown need, or one above the budget, gets the whole budget."""
        if self.why_alone(need):
            return self.budget, True
        return int(need), False

    def why_alone(self, need: int | None) -> str | None:
        """Why a job of ``need`` bytes runs alone (``details.memory.alone_reason``), None when it shares."""
        if need is None:
            return "no estimate"
        if need > self.budget:
            return "need > the budget"
        return None

    def _goes(self, grant: int, ahead: list[_Ticket]) -> bool:
        """Whether a job granted ``grant`` is admitted now, with ``ahead`` waiting before it: its grant is free
        and none of them has been passed as often as it may be."""
        return self.used + grant <= self.budget and all(t.passed < self.max_bypass for t in ahead)

    def _may_go(self, ticket: _Ticket) -> bool:
        return self._goes(ticket.grant, self._queue[:self._queue.index(ticket)])

    def fits_now(self, need: int | None) -> bool:
        """Whether a job of ``need`` bytes would be admitted at once, behind every job waiting now (what a free
        slot asks before it takes a job: ``_slots.JobQueue``)."""
        grant, _ = self.grant_for(need)
        with self._cond:
            return self._goes(grant, self._queue)

    def admit(self, need: int | None, alone: bool = False, floor: int | None = None) -> tuple[int, bool]:
        """Wait until the job fits; returns (bytes granted, alone). Raises :class:`TooBig` when its
        ``floor`` (the least it can run with) exceeds the budget."""
        if floor is not None and floor > self.budget:
            raise TooBig(f"the reference alone holds about {floor / GIB:.2f} GiB of device memory; the budget "
                         f"is {self.budget / GIB:.2f} GiB")
        grant, big = self.grant_for(need)
        if alone:
            grant, big = self.budget, True
        ticket = _Ticket(grant)
        with self._cond:
            self._queue.append(ticket)
            try:
                while not self._may_go(ticket):
                    self._cond.wait()
            except BaseException:
                self._queue.remove(ticket)
                self._cond.notify_all()
                raise
            i = self._queue.index(ticket)
            for t in self._queue[:i]:  # passed while they wait for more memory than is free
                t.passed += 1
            del self._queue[i]
            self.used += grant
            self.jobs += 1
            self._cond.notify_all()
        return grant, big

    def shrink(self, grant: int, smaller: int) -> int:
        """A running job's grant made ``smaller`` (its measured need); returns the grant it now holds."""
        if smaller >= grant:
            return grant
        with self._cond:
            self.used -= grant - smaller
            self._cond.notify_all()
        return smaller

    def release(self, grant: int) -> None:
        with self._cond:
            self.used -= grant
            self.jobs -= 1
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)

    @contextlib.contextmanager
    def admitted(self, need: int | None, alone: bool = False, floor: int | None = None) -> Iterator[tuple[int, bool]]:
        got = self.admit(need, alone, floor)
        try:
            yield got
        finally:
            self.release(got[0])


# How many later jobs may pass one waiting for memory (backfill) before the queue is strictly in order
# for it: enough to fill a card around a large job, few enough that the large job's wait stays bounded.
MAX_BYPASS = 8


class _Ticket:
    __slots__ = ("grant", "passed")

    def __init__(self, grant: int) -> None:
        self.grant, self.passed = grant, 0


def retry_admission(error_class: str, infra: bool, kind: str, alone: bool, grant: int | None, budget: int,
                    attempts: int, refs_on_device: int = 0) -> tuple[bool, int | None, str | None] | None:
    """How to admit a job again after its attempt number ``attempts`` failed with ``error_class``:
    None (the result stands) or (alone, need, alone_reason).

    An out-of-memory while sharing a budget -- our machinery's (``infra:oom``), or on a GPU the
    candidate's (``oom``) -- means the grant was too small, not the device: the first retry gets twice
    the grant and still shares (one such job alone serialises a whole pool behind it), alone only
    when twice the grant is more than half the budget. (The CPU pool under ``gpu_bytes`` follows the
    same rules, which is how tests exercise them.) An OOM again while sharing, or any other
    retried infrastructure failure (``sandbox``, a bug of ours), runs alone, so an ``oom`` verdict is
    only ever given with the whole device. A failure alone after a retry is the result -- except an OOM
    alone beside ``refs_on_device`` bytes of the job's own reference outputs (``_reference._OnDevice``):
    that memory was ours, so the job runs alone once more keeping none there (the caller's part). On the H200
    KernelBench's InstanceNorm and GroupNorm winners (torch.compile's code) ran out beside 45 GB of them."""
    oom = error_class in OOM_CLASSES
    if oom and alone and refs_on_device > 0 and kind == "cuda":
        return True, None, f"retry after {error_class} beside reference outputs kept on the device"
    if not ((infra and error_class in RETRIED) or (kind == "cuda" and error_class == "oom" and not alone)):
        return None
    if oom and not alone and grant and attempts == 1 and 2 * grant <= budget // 2:
        return False, 2 * grant, None
    if attempts == 1 or (oom and not alone):
        return True, None, f"retry after {error_class}"
    return None


# infrastructure failures worth another attempt (see retry_admission)
RETRIED = ("infra:oom", "sandbox")


def measured_need(reference_peak: int, compile_timed: bool = False) -> int:
    """A job's need from its problem's measured reference peak (its parameters, one trial's inputs,
    their clone, outputs and activations): twice that -- the candidate's side and the timing's copies --
    plus the poison and the fixed overhead. ``compile_timed`` (a re-timing: torch.compile timed in the
    same interleaving) adds one more: the compiled model's fresh input sets and outputs (twice ran
    KernelBench's 2_Standard_matrix_multiplication_'s final re-timing out of its grant on the H200)."""
    return (3 if compile_timed else 2) * reference_peak + min(POISON_CAP, reference_peak) + JOB_OVERHEAD


def need_peak(peak: int, refs_on_device: int = 0) -> int:
    """A job's measured peak as :func:`measured_need` reads it: the reference outputs the job kept on the
    device (``refs_on_device``, inside ``peak``) are held once, while the need doubles the rest (the
    candidate's side), so half of them is taken off."""
    return peak - refs_on_device // 2


def regrant_cap(peak: int, grant: int | None, floor: int | None = None, compile_timed: bool = False,
                least: int = 0) -> int | None:
    """The smaller grant a running job caps itself at once its reference peak ``peak`` is measured, or None
    to keep ``grant``: never below ``floor`` (a job retried after running out of its grant keeps what it was
    retried with; shrunk back to the measured need, the retry ran out alike, three times), nor below ``least``
    (its own side's floor, :func:`side_need`, and the reference outputs it keeps on the device)."""
    if not grant:
        return None
    need = max(measured_need(peak, compile_timed), floor or 0, least)
    return need if need < grant else None


def side_need(side_peak: int) -> int:
    """The least a job's own side needs -- all it holds but the reference outputs it keeps on the device -- from
    the largest such peak (reserved) a job of its problem measured, an eighth more for another candidate's
    allocations, and the fixed overhead.

    Twice the reference's working peak (:func:`measured_need`) falls short of it where the timing's input sets
    outweigh the reference's working set: KernelBench's level-1 elementwise problems held 51.7 GB besides the
    kept outputs in every job, 2-trial or 5-trial, while twice their working peak gave 40.1 GB. Their jobs kept
    outputs on the device into the difference, or capped themselves there, and ran out of memory under their
    grants: 44 of session 19's 51 retries, 29 of them alone on the card."""
    return side_peak + side_peak // 8 + JOB_OVERHEAD


# an estimated need (no reference peak measured yet) is admitted at this many times the estimate (bounded)
UNMEASURED_MARGIN = 2


def unmeasured_need(estimate: int, budget: int, margin: int = UNMEASURED_MARGIN) -> int:
    """What a job of a problem whose reference peak is not measured yet asks for: ``margin`` times the meta
    device's estimate (which misses the reference's activations: gemm_bias_gelu's was 0.73x its measured
    need), but at most the larger of 5/4 of the estimate and half the budget when that is less. At twice
    its estimate, a KernelBench-size elementwise problem of level 1 asked for 131.7 of the H200's 141.5 GB
    (its jobs peaked at 51.7 GB), so each such problem's first job waited until the card was empty, one
    problem after another (100-324 s of admission each, GPU busy 15%). A job whose estimate fell short
    runs out of its grant and is retried with twice as much (:func:`retry_admission`)."""
    return min(margin * estimate, max(estimate * 5 // 4, budget // 2))


def probes(need: int | None, budget: int) -> bool:
    """Whether a job of an unmeasured problem asking for ``need`` goes alone among its problem's jobs until
    the first of them has measured the reference's peak (``details.memory.probe_wait_s`` for the others):
    above a quarter of the budget, where a few such grants fill the card that the measured need would
    share; below that they wait for nothing."""
    return need is not None and need > budget // 4


def footprint(params: int, inputs: int, outputs: int, largest_input: int = 0) -> int:
    """Bytes one job holds at its peak, from one trial's sizes: the reference's and the candidate's
    parameters; the timing's inputs (trial 0's and a second sample, mixed into two tensor sets each
    for the candidate and for eager: six copies, more than the trials' two); the candidate's output
    next to the previous trial's (kept for the aliasing check) and the reference's and the eager
    timing's; the poison (capped); the input fingerprint's int64 temporaries (``largest_input``
    elements, at most ``FP_CHUNK`` at a time) and a fixed overhead."""
    return (2 * params + 6 * inputs + 4 * outputs + min(POISON_CAP, 4 * (inputs + outputs))
            + 24 * min(largest_input, FP_CHUNK) + JOB_OVERHEAD)


def estimate_bytes(problem: Any, small: bool) -> int | None:
    """The job footprint of ``problem`` (see :func:`estimate`), or None when unknown."""
    est = estimate(problem, small)
    return est[0] if est else None


def estimate_floor_bytes(problem: Any, small: bool) -> int | None:
    """The least ``problem``'s reference holds at once (see :func:`estimate`), or None when unknown."""
    est = estimate(problem, small)
    return est[1] if est else None


def estimate(problem: Any, small: bool, strict: bool = False) -> tuple[int, int] | None:
    """(footprint, floor) of a job of ``problem``, built on the meta device (its sizes without
    memory): the floor is its parameters, one trial's inputs and outputs, what the reference needs
    at the least. None when the problem cannot be built there (an op without a meta kernel,
    data-dependent shapes); ``strict``: raise that failure instead."""
    import torch

    from kernellab.problem import cast_inputs, output_tensors, torch_dtype

    try:
        # the module first, outside the meta device: deriving a small instance runs the reference once
        mod = problem.module(small=small)
        with torch.device("meta"):
            dtype = torch_dtype(getattr(mod, "DTYPE", "float32"))
            model = mod.Model(*list(mod.get_init_inputs())).to(dtype=dtype)
            inputs = cast_inputs(list(mod.get_inputs()), dtype, "meta")
            with torch.no_grad():
                outs = output_tensors(model(*inputs))
    except Exception:
        if strict:
            raise
        return None
    if not outs:
        if strict:
            raise ValueError("the reference returned no tensor on the meta device")
        return None

    def size(ts: Any) -> int:
        return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))

    params = size(list(model.parameters()) + list(model.buffers()))
    largest = max((t.numel() for t in inputs if isinstance(t, torch.Tensor)), default=0)
    return footprint(params, size(inputs), size(outs), largest), params + size(inputs) + size(outs)
