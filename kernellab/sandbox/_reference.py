"""The reference side of a job: the trials' inputs and their prints, the reference outputs, their cache.

Everything here runs before the candidate's module is executed (see ``_job``): :func:`_reference` builds the
reference model and every trial's inputs and outputs, or takes the outputs from the worker's cache
(:class:`_References`, keyed by ``_result.reference_key``) when the executor vouches for them. A trial
(:class:`_Trial`) regenerates its large inputs from their seeds and checks them against the fingerprint
(:func:`_fingerprint`) taken when the reference ran; :class:`_Fresh` mixes the timed repetitions' inputs, whose
last mix's reference output is computed here too. Also the faults the reference (or a trial's inputs) can
raise, which ``_job.run_job`` turns into a verdict: :class:`_ProblemFault` (the problem's), :class:`_InfraFault`
(ours). Kept apart from the checks of the candidate (``_trials``) and the timing (``_measure``), which read what
this module computed and never the other way round.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import torch

from kernellab.problem import output_tensors
from kernellab.vocab import SEED

from ._check import (
    DISTRIBUTIONS,
    bit_sums,
    bits_of,
    clone_all,
    distribution,
    null_constants,
    null_verdict,
    overlaps,
    transform,
    trial_atol,
)
from ._gpu import FP_CHUNK, GIB
from ._protocol import JobSpec, Msg
from ._result import (
    is_oom,
    reference_key,
)

# Timing writes fresh inputs before every repetition, and moves them to the other of two tensor
# sets every this many repetitions (new addresses as well as new values).
FRESH_EVERY = 4
# The mix of the last timed repetition (its reference is computed with the trials'): a band of its own
# between the two bands of the other repetitions (see _Fresh), so no earlier output is close to its own.
FINAL_MIX = 0.5
MIX_BANDS = ((0.1, 0.35), (0.65, 0.9))


def _fingerprint(xs: list, device: torch.device | None = None) -> list:
    """Per input: shape, dtype and two position-weighted sums of its bits (computed where the tensor
    lives, or on ``device``, chunk by chunk), or the value itself when not a tensor. Equal inputs give
    equal prints, wherever they are computed (integer sums)."""
    out: list = []
    for x in xs:
        if not isinstance(x, torch.Tensor):
            out.append(repr(x))
            continue
        bits = bits_of(x.detach().contiguous().reshape(-1))
        s1, s2 = 0, 0
        for lo in range(0, bits.numel(), FP_CHUNK):
            s1, s2 = bit_sums(bits[lo:lo + FP_CHUNK].to(device or bits.device), lo, (s1, s2))
        out.append((tuple(x.shape), str(x.dtype), str(x.stride()), s1, s2))
    return out


def _value_prints(xs: list, device: torch.device | None = None) -> list:
    """The prints of :func:`_fingerprint` without the strides: a copy to the host keeps the values, not
    always the layout (an expanded output comes back contiguous)."""
    return [p[:2] + p[3:] if isinstance(p, tuple) else p for p in _fingerprint(xs, device)]


# A trial's inputs up to this size stay alive for the whole job (a read returns a fresh copy):
# cheaper than regenerating them, and the memory does not matter. Larger ones are regenerated.
KEEP_INPUTS_BYTES = int(float(os.environ.get("KERNELLAB_SANDBOX_KEEP_INPUTS_BYTES", 16 << 20)))


class _Trial:
    """One correctness trial. Read like the dict it used to be (``tr["dist"]``, ``tr["ref"]``,
    ``tr["inputs"]``): ``ref`` are the reference outputs (for a GPU worker on the device where
    :class:`_OnDevice` keeps them, else on the CPU) and ``out_prints`` their value prints, taken where they
    were computed, before the candidate was loaded; each read of ``inputs`` gives fresh tensors: a copy
    of small inputs kept since the reference ran, or large ones regenerated on the device from the
    trial's seeds, so that at most one trial's large inputs are alive at a time."""

    def __init__(self, index: int, dist: str, make: Any, ref: list[torch.Tensor], prints: list,
                 out_prints: list, kept: list | None = None) -> None:
        self.index, self.dist, self.ref, self.prints, self._make = index, dist, ref, prints, make
        self.kept, self.out_prints = kept, out_prints

    def inputs(self) -> list:
        if self.kept is not None:
            return clone_all(self.kept)
        x = self._make(self.index)
        if _fingerprint(x) != self.prints:
            raise _ProblemFault(f"trial {self.index}: get_inputs gave other inputs under the same seed than "
                                "when the reference ran (the problem's inputs must be reproducible from torch's seed)")
        return x

    def __getitem__(self, key: str) -> Any:
        if key == "inputs":
            return self.inputs()
        if key == "dist":
            return self.dist
        if key == "ref":
            return self.ref
        raise KeyError(key)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# A trial's reference outputs of at least this many bytes stay on the GPU where the job's grant holds them
# (:class:`_OnDevice`); smaller ones go to the host, where the worker's cache keeps them for later jobs.
KEEP_ON_DEVICE_BYTES = int(float(os.environ.get("KERNELLAB_SANDBOX_KEEP_ON_DEVICE_BYTES", 256 << 20)))


def keeps_on_device(working_peak: int, kept: int, nbytes: int, grant: int, compile_timed: bool = False,
                    side: int = 0) -> bool:
    """Whether a job granted ``grant`` bytes keeps ``nbytes`` more reference outputs on the device, beside the
    ``kept`` it keeps already: when they are large (``KEEP_ON_DEVICE_BYTES``) and the grant holds all of them
    once next to the need of the job's own side -- the need of the reference's working peak
    (``_gpu.measured_need``: the candidate's side twice over), or ``side`` where that is more (``JobSpec.side_bytes``).
    At KernelBench's level-1 sizes (6.4 GB outputs) the copies to pageable host memory ran at 1.4 GB/s: 22-25 s of
    a 28-32 s reference, and 3-10 s more for the check's way back."""
    from ._gpu import measured_need

    return nbytes >= KEEP_ON_DEVICE_BYTES and max(measured_need(working_peak, compile_timed), side) + kept + nbytes <= grant


# The host memory a job leaves free when it keeps reference outputs there (KERNELLAB_SANDBOX_HOST_FLOOR_BYTES, else
# :func:`host_floor`). A job that cannot is an ``infra:oom`` (retried with a larger grant, then alone: fewer keeps
# beside it) rather than a host out of memory, which takes the whole machine and every campaign's unsaved work.
HOST_FLOOR_ENV = "KERNELLAB_SANDBOX_HOST_FLOOR_BYTES"


def host_memory(meminfo: str = "/proc/meminfo") -> tuple[int, int] | None:
    """(available, total) bytes of the host's memory as the kernel counts them, None where it does not say."""
    try:
        with open(meminfo) as f:
            kb = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f) if v.strip()}
        return kb["MemAvailable"] * 1024, kb["MemTotal"] * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None


def host_floor_setting() -> int | None:
    """``KERNELLAB_SANDBOX_HOST_FLOOR_BYTES`` in bytes, None where it is not set; ValueError where it is not a
    number of bytes >= 0 (the executor refuses it before any worker starts)."""
    env = os.environ.get(HOST_FLOOR_ENV)
    if env is None:
        return None
    try:
        n = int(float(env))
    except OverflowError:
        raise ValueError(env) from None
    if n < 0:
        raise ValueError(env)
    return n


def host_floor(total: int) -> int:
    """What the host keeps free: :func:`host_floor_setting`, else a sixteenth of its memory, at least 4 GiB or
    an eighth (8 GiB of 128, 3 GiB of 24)."""
    setting = host_floor_setting()
    return setting if setting is not None else max(total // 16, min(4 * GIB, total // 8))


def host_short(nbytes: int, meminfo: str = "/proc/meminfo") -> str | None:
    """Why ``nbytes`` more of reference outputs do not fit on the host beside its floor (0: whether the host is
    above it at all), None when they do or the host's memory is unknown."""
    mem = host_memory(meminfo)
    if mem is None:
        return None
    avail, total = mem
    floor = host_floor(total)
    if avail - nbytes >= floor:
        return None
    return (f"host memory: keeping {nbytes / GIB:.2f} GiB more of reference outputs leaves "
            f"{max(0, avail - nbytes) / GIB:.2f} GiB of the host's {total / GIB:.1f} GiB free, under its "
            f"{floor / GIB:.2f} GiB floor ({HOST_FLOOR_ENV})")


class _OnDevice:
    """The reference outputs one GPU job keeps on the device (``bytes``), decided output list by output
    list with :func:`keeps_on_device` on the job's grant (the device's memory when it has none)."""

    def __init__(self, dev: torch.device, grant: int | None, compile_timed: bool, side: int | None = None) -> None:
        self.dev, self.compile_timed, self.bytes, self.lists, self.side = dev, compile_timed, 0, 0, int(side or 0)
        self.grant = grant or torch.cuda.get_device_properties(dev).total_memory

    def take(self, nbytes: int) -> bool:
        work = torch.cuda.max_memory_allocated(self.dev) - self.bytes
        if not keeps_on_device(work, self.bytes, nbytes, self.grant, self.compile_timed, self.side):
            return False
        self.bytes += nbytes
        self.lists += 1
        return True


def _owned(outs: list[torch.Tensor], others: list) -> list[torch.Tensor]:
    """``outs`` detached, each one that shares memory with a tensor of ``others`` (a parameter or buffer: a model
    may return one) or views a larger storage (a slice of an activation) copied: what is kept is the
    reference's alone, and as large as it is counted. (The forward ran on clones of the trial's inputs, which
    nothing else holds.)"""
    mine = []
    for t in outs:
        t = t.detach()
        if t.untyped_storage().nbytes() > t.numel() * t.element_size() or any(
                isinstance(o, torch.Tensor) and overlaps(t, o) for o in others):
            t = t.clone()
        mine.append(t)
    return mine


class _ProblemFault(Exception):
    """The problem itself failed in the worker (not the candidate's fault)."""


class _InfraFault(Exception):
    """Our own machinery failed (e.g. out of memory building the reference): ``infra:<kind>``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _reference(w: Any, job: JobSpec, state: dict, d: dict) -> None:
    """Build the reference model and every trial's reference outputs, or take the outputs from the
    worker's cache (:class:`_References`) when this job allows it (``reuse_reference``; never for a
    re-timing, whose printed number comes from outputs computed in its own job) and the executor
    vouches for them (``ref_digest``: what this worker reported when it computed them, before any
    candidate of that job ran). Between trials the GPU's shared hold is given up and asked for again,
    so a timing waiting for the GPU waits for one trial, not for the whole reference."""
    from kernellab.problem import instantiate, make_inputs

    problem, small, dev = job.problem, job.small, w.device
    n = max(1, int(job.trials))
    timing_on = bool(job.timing)
    key = reference_key(problem.id, bool(small), n, timing_on)
    cache = _references(w)
    info = d.setdefault("reference", {"key": key})
    t_ref = time.perf_counter()
    entry = cache.take(key, job.ref_digest) if job.reuse_reference else None
    try:
        inst = instantiate(problem, small=small, seed=SEED, device=dev)
        settings = problem.settings(inst.module)
        mod = inst.module
        inst.inputs = []  # instantiate's own sample: the trials make theirs, one at a time

        def make(t: int) -> list:
            base = make_inputs(mod, inst.dtype, dev, SEED + 1 + t)
            # the synthetic distributions' draws on the device too (seconds each on the host at full size)
            gen = torch.Generator(device=dev).manual_seed(SEED + 1000 + t)
            return transform(base, distribution(t), gen)

        if entry is not None and not entry.intact(dev):
            # changed since it was computed (a candidate of an earlier job reached it): computed anew
            info["cache_changed"] = True
            cache.drop(key)
            entry = None
        trials = []
        # where the reference's time goes (``reference.parts_s``), the device synchronised at each boundary:
        # at KernelBench's level-1 sizes it took 27-31 s of a 45 s evaluation on the H200
        parts: dict[str, float] = {}
        clock = [time.perf_counter()]

        def lap(name: str) -> None:
            _sync(dev)
            now = time.perf_counter()
            parts[name] = parts.get(name, 0.0) + now - clock[0]
            clock[0] = now

        # the outputs' prints where they are computed (on the device: cheap): what the check holds them to,
        # and, while they may still be cached, what a later job's reuse is checked against
        cap = int(job.ref_cache_bytes or 0) if job.reuse_reference else 0
        ref_prints: list | None = [] if entry is None and cap > 0 else None
        held = 0
        on_device = _OnDevice(dev, job.gpu_grant_bytes, bool(job.time_compile), job.side_bytes) if dev.type == "cuda" else None

        atol, rtol = settings["atol"], settings["rtol"]
        # A job of fewer trials than distributions (a tuning trial's two) whose trials a null output would all
        # pass gets more, up to one of each distribution, until one would not: KernelBench's level2/9 at its
        # own size is all zeros on its first two (ReLU of a shifted GEMM), informative on the third, and
        # its tuning trials were refused as the problem's fault while its 5-trial evaluations judged fine.
        limit = max(n, len(DISTRIBUTIONS))
        atols = [trial_atol(atol, distribution(t)) for t in range(limit)]
        nulls: list[str | None] = list(entry.nulls) if entry is not None else []
        consts: list[float] = []

        def judged(t: int, outs: list[torch.Tensor]) -> None:
            # whether a null output would pass this trial: a property of the reference alone, judged where
            # it was computed (on the device), once per problem when the outputs are reused
            if t == 0:
                consts.extend(null_constants(outs, max(atols[:n]), rtol))
            nulls.append(null_verdict(outs, atols[t], rtol, consts))

        def computed(outs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list]:
            nonlocal ref_prints, held
            prints = _value_prints(outs)
            nbytes = sum(t_.numel() * t_.element_size() for t_ in outs)
            if on_device is not None and on_device.take(nbytes):
                ref_prints = None  # this job's alone: the cache holds outputs on the host only
                w.refs_on_device = on_device.bytes  # so far: an out-of-memory before the end says they were there
                return _owned(outs, list(inst.model.parameters()) + list(inst.model.buffers())), prints
            more = nbytes if dev.type == "cuda" else 0  # on the CPU they are on the host already
            short = host_short(more)
            if short and cache.nbytes:  # this worker's cached outputs of other problems go first
                cache.clear()
                short = host_short(more)
            if short:
                raise _InfraFault("oom", f"{problem.label}: {short}")
            held += nbytes
            if ref_prints is not None and held <= cap:
                ref_prints.append(prints)
            else:
                ref_prints = None
            return [t_.detach().to("cpu") for t_ in outs], prints

        def more(t: int) -> bool:
            if entry is not None:
                return t < len(entry.refs)
            return t < n or (t < limit and all(v is not None for v in nulls))

        t = 0
        while more(t):
            if t:  # a preemption point: a timing waiting for the GPU goes first
                _sync(dev)
                w.unread()
                w.read()
            clock[0] = time.perf_counter()
            x = make(t)
            lap("inputs")
            prints = _fingerprint(x)
            lap("fingerprint")
            if entry is not None:
                if prints != entry.input_prints[t]:
                    raise _ProblemFault(f"trial {t}: get_inputs gave other inputs under the same seed than when the "
                                        "reference ran (the problem's inputs must be reproducible from torch's seed)")
                ref, out_prints = entry.refs[t], entry.ref_prints[t]
            else:
                with torch.no_grad():
                    _reseed(t)
                    ref = output_tensors(inst.model(*clone_all(x)))
                lap("forward")
                if ref is None:
                    raise _ProblemFault(f"{problem.label}: Model.forward returned no tensors")
                judged(t, ref)
                lap("null_check")
                ref, out_prints = computed(ref)
                lap("keep")  # to the host, or kept on the device (_OnDevice)
            size = sum(v.numel() * v.element_size() for v in x if isinstance(v, torch.Tensor))
            trials.append(_Trial(t, distribution(t), make, ref, prints, out_prints,
                                 kept=x if size <= KEEP_INPUTS_BYTES else None))
            del x
            t += 1
        if len(trials) > n:
            info["extra_trials"] = len(trials) - n
        timing = None
        if timing_on:
            # a second sample of the problem's inputs, which timing mixes with trial 0's (see _Fresh),
            # and the reference output for the last timed repetition's mix
            base = make_inputs(mod, inst.dtype, dev, SEED + 500)
            if entry is not None:
                final_ref, final_prints = entry.final_ref, entry.ref_prints[-1]
            else:
                final = _Fresh.mix(trials[0]["inputs"], base, FINAL_MIX)
                with torch.no_grad():
                    _reseed(_FINAL_TRIAL)
                    final_ref, final_prints = computed(output_tensors(inst.model(*clone_all(final))) or [])
            timing = {"base": base, "final_ref": final_ref, "final_prints": final_prints}
        _sync(dev)
        if ref_prints is not None:
            made = cache.put(key, [tr.ref for tr in trials], timing["final_ref"] if timing else None,
                             [tr.prints for tr in trials], ref_prints, cap, nulls)
            if made is not None:
                w.send(Msg.REFERENCE, key, made.digest)  # before any candidate runs: the executor vouches for it
    except (_ProblemFault, _InfraFault):
        raise
    except Exception as exc:
        msg = f"{problem.label}: the reference failed in the worker: {type(exc).__name__}: {exc}"
        if is_oom(exc):
            raise _InfraFault("oom", msg) from exc
        raise _ProblemFault(msg) from exc
    info.update(reused=entry is not None, s=round(time.perf_counter() - t_ref, 3),
                parts_s={k: round(v, 3) for k, v in parts.items()})
    if w.refs_on_device:  # what the job's peak holds once, not twice (Worker.need_peak)
        info.update(on_device_bytes=on_device.bytes, on_device_lists=on_device.lists)
    state.update(ref_mod=mod, ref_model=inst.model, init=inst.init_inputs, dtype=inst.dtype, null=nulls,
                 atol=settings["atol"], rtol=settings["rtol"], trials=trials, mode=settings["mode"], timing=timing)
    d["tolerance"] = {"atol": settings["atol"], "rtol": settings["rtol"], "dtype": settings["dtype"]}
    d["mode"] = settings["mode"]
    d["small"] = bool(small)


class _Cached:
    """One problem's reference outputs (on the host), the prints of the inputs they were computed from,
    and the prints of the outputs taken where they were computed (``digest``: their hash)."""

    def __init__(self, refs: list, final_ref: list | None, input_prints: list, ref_prints: list,
                 nulls: list | None = None) -> None:
        from kernellab.problem import content_hash

        self.refs, self.final_ref, self.input_prints, self.ref_prints = refs, final_ref, input_prints, ref_prints
        self.nulls = list(nulls or [])
        self.digest = content_hash(repr((input_prints, ref_prints, self.nulls)))
        self.nbytes = sum(t.numel() * t.element_size() for ts in refs + [final_ref or []] for t in ts)

    def intact(self, dev: torch.device) -> bool:
        """Whether the outputs still have the prints they were computed with (fingerprinted on ``dev``)."""
        outs = self.refs + ([self.final_ref] if self.final_ref is not None else [])
        return [_value_prints(ts, dev) for ts in outs] == self.ref_prints


class _References:
    """The worker's reference outputs by :func:`reference_key`, least recently used first out, at most
    ``cap`` bytes on the host (the executor's share of the host's memory for this worker). The
    reference of a problem is the same in every job of it (the same seeds, inputs checked by their
    prints), so the forward passes and device-to-host copies are paid once per worker, not per job."""

    def __init__(self) -> None:
        import collections

        self._entries: collections.OrderedDict[str, _Cached] = collections.OrderedDict()

    def take(self, key: str, digest: str | None) -> _Cached | None:
        entry = self._entries.get(key)
        if entry is None or digest is None or entry.digest != digest:
            return None
        self._entries.move_to_end(key)
        return entry

    def drop(self, key: str) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def put(self, key: str, refs: list, final_ref: list | None, input_prints: list, ref_prints: list,
            cap: int, nulls: list | None = None) -> _Cached | None:
        entry = _Cached(refs, final_ref, input_prints, ref_prints, nulls)
        self._entries.pop(key, None)
        if entry.nbytes > cap:
            return None
        while self._entries and self.nbytes + entry.nbytes > cap:
            self._entries.popitem(last=False)
        self._entries[key] = entry
        return entry

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())


def _references(w: Any) -> _References:
    cache = getattr(w, "references", None)
    if cache is None:
        cache = w.references = _References()
    return cache


_FINAL_TRIAL = -1  # the seed of the last timed repetition, whose output is checked


def _reseed(trial: int) -> None:
    """The global RNG right before a checked forward: the same state for the reference's call and
    the candidate's call of one trial, so a forward that draws random numbers (dropout in training
    mode) draws the same ones in both -- when it draws them the way the reference does (torch's
    own dropout); a kernel with its own generator cannot match and is judged incorrect."""
    torch.manual_seed(SEED + 500 + trial)


class _Fresh:
    """The inputs of one timed callable, rewritten before each repetition (outside the timed region).

    Each repetition gets a convex mix ``a + c (b - a)`` of two samples of the problem's own inputs
    (trial 0's and a second one), with a new random ``c``: a mix keeps whatever a problem's inputs
    share that is convex (signs, ranges, triangular or symmetric matrices, probability rows), yet no
    two repetitions see the same values, so nothing keyed on the inputs (address, version, values)
    can hand back an earlier result. ``c`` alternates between the two MIX_BANDS, and the last
    repetition gets FINAL_MIX, between them: an output left over from any earlier repetition, or from
    the unmixed inputs of the trials, is far from the last one's, whose reference was computed before
    the candidate was loaded. Every FRESH_EVERY repetitions the values go to the other of two tensor
    sets. Non-float inputs (indices, masks) alternate between the two samples."""

    def __init__(self, a: list, b: list, seed: int) -> None:
        self.a, self.b = a, b
        self.sets = [clone_all(a), clone_all(a)]
        self.current = self.sets[0]
        self.rng = random.Random(seed)
        self.n = 0
        self.last = False

    @staticmethod
    def mix(a: list, b: list, c: float, out: list | None = None, n: int = 0) -> list:
        out = clone_all(a) if out is None else out
        for a_, b_, x in zip(a, b, out, strict=False):
            if not isinstance(x, torch.Tensor):
                continue
            if (x.is_floating_point() or x.is_complex()) and a_.shape == b_.shape == x.shape:
                torch.lerp(a_, b_, c, out=x)
            else:
                x.copy_(b_ if n % 2 and b_.shape == x.shape else a_)
        return out

    def __call__(self, last: bool = False, same_tensors: bool = False) -> None:
        if not same_tensors:
            self.current = self.sets[(self.n // FRESH_EVERY) % 2]
        c = FINAL_MIX if last else self.rng.uniform(*MIX_BANDS[self.n % 2])
        self.n += 1
        self.last = last
        # the last mix's non-float inputs are those _reference gave its reference: the first sample's
        self.mix(self.a, self.b, c, self.current, 0 if last else self.n)
