"""The pipeline's throughput mechanisms on the CPU: reference outputs reused across jobs (and their
integrity), compiles off the GPU's shared hold, the pool sized to the host."""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path

from kernellab import Problem
from kernellab.sandbox import EvalJob, LocalExecutor, evaluate
from kernellab.sandbox._executor import host_workers_per_gpu, reference_cache_bytes
from kernellab.sandbox._gpu import RWLock
from kernellab.sandbox._worker import Worker

ADV = Path(__file__).resolve().parent / "adversarial"
RELU = (ADV / "correct_torch.py").read_text()
ZEROS = (ADV / "returns_zeros.py").read_text()

# zeroes the reference outputs the worker keeps between jobs, and returns the right answer
TAMPERS = textwrap.dedent('''
    import gc
    import torch

    class ModelNew(torch.nn.Module):
        def forward(self, x):
            for o in gc.get_objects():
                if type(o).__name__ == "_Cached":
                    for ts in o.refs:
                        for t in ts:
                            if OTHERS_ONLY is False or t.shape != x.shape:
                                t.zero_()
            return torch.relu(x * 2.0) + 1.0
    OTHERS_ONLY = False
''')
# zeroes the cached outputs of other problems only: its own checks, which read its own, pass
TAMPERS_OTHERS = TAMPERS.replace("OTHERS_ONLY = False", "OTHERS_ONLY = True")


def _problem(name: str = "reuse", shape: str = "8, 127") -> Problem:
    return Problem(name=name, source=textwrap.dedent('''
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x * 2.0) + 1.0
        def get_inputs():
            return [torch.randn(SHAPE)]
        def get_init_inputs():
            return []
    ''').replace("SHAPE", shape))


def _ref(r: dict) -> dict:
    return r["details"]["reference"]


def test_reference_outputs_are_computed_once_per_worker_and_reused():
    p = _problem()
    ex = LocalExecutor(cpu_workers=1)
    try:
        first = evaluate(p, RELU, trials=2, timing=False, executor=ex)
        second = evaluate(p, RELU, trials=2, timing=False, executor=ex)
        assert first["status"] == second["status"] == "correct", (first["error_text"], second["error_text"])
        assert _ref(first)["reused"] is False and _ref(second)["reused"] is True
        # the check is not loosened: a wrong candidate judged on reused outputs is still wrong
        zeros = evaluate(p, ZEROS, trials=2, timing=False, executor=ex)
        assert _ref(zeros)["reused"] is True and zeros["status"] == "incorrect", zeros["error_text"]
        # other trials: other outputs, computed anew
        five = evaluate(p, RELU, trials=3, timing=False, executor=ex)
        assert _ref(five)["reused"] is False and five["status"] == "correct"
        # a re-timing (the printed number) computes its reference in its own job
        retime = ex.submit(EvalJob(p, RELU, trials=2, timing=False, retime=True)).result()
        assert retime["status"] == "correct" and _ref(retime)["reused"] is False
    finally:
        ex.shutdown()


def test_reference_outputs_changed_by_a_candidate_are_not_reused():
    p = _problem("tamper")
    ex = LocalExecutor(cpu_workers=1)
    try:
        assert evaluate(p, RELU, trials=2, timing=False, executor=ex)["status"] == "correct"
        bad = evaluate(p, TAMPERS, trials=2, timing=False, executor=ex)
        # it zeroed the outputs its own trials are judged against: the comparison holds them to their prints
        assert bad["error_class"] == "integrity:reference_modified", bad
        assert evaluate(p, RELU, trials=2, timing=False, executor=ex)["status"] == "correct"  # a new worker's
        # a candidate of another problem that zeroes this one's cached outputs passes its own checks: this
        # problem's next job finds its cache changed and computes the outputs anew
        other = evaluate(_problem("other", "4, 63"), TAMPERS_OTHERS, trials=2, timing=False, executor=ex)
        assert other["status"] == "correct", other["error_text"]
        after = evaluate(p, RELU, trials=2, timing=False, executor=ex)
        assert after["status"] == "correct", after["error_text"]
        assert _ref(after).get("cache_changed") is True and _ref(after)["reused"] is False
        again = evaluate(p, RELU, trials=2, timing=False, executor=ex)
        assert _ref(again)["reused"] is True and again["status"] == "correct"
    finally:
        ex.shutdown()


def test_no_reuse_without_a_cache_budget():
    p = _problem("nocache")
    ex = LocalExecutor(cpu_workers=1, ref_cache_bytes=0)
    try:
        rs = [evaluate(p, RELU, trials=2, timing=False, executor=ex) for _ in range(2)]
        assert [_ref(r)["reused"] for r in rs] == [False, False]
    finally:
        ex.shutdown()


def test_pool_is_sized_to_the_host_not_to_the_jobs():
    assert host_workers_per_gpu(16, 1) == 8  # the H200 host: 16 cores, one GPU
    assert host_workers_per_gpu(32, 2) == 8
    assert host_workers_per_gpu(2, 1) == 1
    assert reference_cache_bytes(8, total=128 << 30) == 8 << 30  # the H200 host's pool of 8
    assert reference_cache_bytes(1, total=1 << 40) == 16 << 30  # capped


class _Holder:
    """What Worker.off_gpu needs of a worker, with the executor's side played by a real RWLock."""

    def __init__(self, lock: RWLock) -> None:
        self.lock, self.reading = lock, False
        self.main_thread = threading.current_thread()
        self.torch = type("T", (), {"cuda": type("C", (), {"synchronize": staticmethod(lambda: None)})})

    def read(self) -> None:
        self.lock.acquire_read()
        self.reading = True

    def unread(self) -> None:
        self.reading = False
        self.lock.release_read()


def test_a_compile_gives_up_the_gpus_shared_hold_and_takes_it_back():
    lock = RWLock()
    w = _Holder(lock)
    w.read()
    timed = threading.Event()

    def timing() -> None:  # another job's timing: the writer
        with lock.write():
            timed.set()

    def compile_() -> str:
        t = threading.Thread(target=timing)
        t.start()
        # the writer gets the GPU while the compile runs on the host
        assert timed.wait(5), "the timing waited for the compile"
        t.join(5)
        return "binary"

    assert Worker.off_gpu(w, compile_)() == "binary"
    assert w.reading is True and lock.state == (1, False, 0)  # the hold is back for the launch
    w.unread()
    # a worker that holds no read (the timing's writer lock, or no GPU work) keeps what it holds
    assert Worker.off_gpu(w, lambda: lock.state)() == (0, False, 0)


def test_inductors_compile_is_host_work_and_its_benchmarks_hold_the_gpu():
    lock = RWLock()
    w = _Holder(lock)
    w.off = False
    w.read()
    seen = []
    bench = Worker.on_gpu(w, lambda: seen.append(lock.state))

    def compile_fx() -> str:  # the lowering, a benchmark of pad_mm's, more lowering
        seen.append(lock.state)
        bench()
        seen.append(lock.state)
        return "code"

    assert Worker.off_gpu(w, compile_fx)() == "code"
    assert seen == [(0, False, 0), (1, False, 0), (0, False, 0)]
    assert lock.state == (1, False, 0) and w.reading  # the hold back for what was compiled
    Worker.on_gpu(w, lambda: seen.append(lock.state))()  # outside a compile: the hold as it is
    assert seen[-1] == (1, False, 0) and lock.state == (1, False, 0)
    w.unread()


def test_release_for_inductor_wraps_what_torch_compile_looks_up_when_it_compiles():
    # in a child: the wrappers patch torch's modules process-wide
    import subprocess
    import sys

    script = textwrap.dedent("""
        import inspect, torch
        import torch._inductor.compile_fx as cfx
        from torch._inductor.runtime import benchmarking
        from kernellab.sandbox._compilers import release_for_inductor
        calls = []
        def off(fn):
            def call(*a, **k):
                calls.append("off"); return fn(*a, **k)
            call._kernellab_off_gpu = True
            return call
        def on(fn):
            def call(*a, **k):
                calls.append("on"); return fn(*a, **k)
            return call
        names = release_for_inductor(off, on)
        assert "torch._inductor.compile_fx.compile_fx" in names, names
        assert release_for_inductor(off, on)[:1] != ["torch._inductor.compile_fx.compile_fx"]  # not twice
        # torch.compile's default backend imports compile_fx when it compiles: it finds the wrapped one
        src = inspect.getsource(torch._TorchCompileInductorWrapper.__call__)
        assert "from torch._inductor.compile_fx import compile_fx" in src, src
        print("ok", len(names))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]


def test_the_compile_hold_release_is_bounded_to_the_main_thread():
    lock = RWLock()
    w = _Holder(lock)
    w.read()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("state", Worker.off_gpu(w, lambda: lock.state)()))
    t.start()
    t.join(5)
    assert out["state"] == (1, False, 0)  # a candidate's own thread does not drop the main thread's hold
    w.unread()


def test_profiling_holds_the_gpu_alone_only_for_the_profiled_forward(tmp_path):
    import sys

    from kernellab.sandbox._executor import ProfileGate
    from kernellab.sandbox._profile import run_gated
    from kernellab.sandbox._profile_target import GATE_DONE, GATE_GO, GATE_READY, GATE_SHARE, GATE_SHARED

    lock = RWLock()
    gate = ProfileGate("0", lock)
    assert lock.state == (0, False, 0)  # the target's start-up (imports under ncu) holds nothing
    seen = {}
    # a stand-in for ncu + its target: imports (no GPU), asks to share the GPU and warms up, waits for the GPU
    # alone, profiles, finishes, then writes its report
    script = (f"import pathlib, time; d = pathlib.Path({str(tmp_path)!r}); time.sleep(0.3); (d / {GATE_SHARE!r}).touch()\n"
              f"while not (d / {GATE_SHARED!r}).exists(): time.sleep(0.01)\n"
              f"time.sleep(0.3); (d / {GATE_READY!r}).touch()\n"
              f"while not (d / {GATE_GO!r}).exists(): time.sleep(0.01)\n"
              f"time.sleep(0.3); (d / {GATE_DONE!r}).touch(); time.sleep(0.3); print('report')")

    def watch() -> None:
        for _ in range(200):
            seen.setdefault(lock.state, time.monotonic())
            time.sleep(0.01)

    t0 = time.monotonic()
    t = threading.Thread(target=watch)
    t.start()
    run = run_gated([sys.executable, "-c", script], tmp_path, {}, 30.0, gate)
    t.join()
    assert run.returncode == 0 and "report" in run.stdout
    assert seen[(0, False, 0)] - t0 < 0.2  # nothing held while the target started
    assert (0, True, 0) in seen  # alone for the profiled forward
    assert seen[(0, False, 0)] < seen[(1, False, 0)] < seen[(0, True, 0)]  # shared for the warm-up only
    assert lock.state == (0, False, 0)  # neither held after the forward: the report needs no GPU
    # the run's phases, for the profile event: the stand-in's forward took 0.3 s alone
    assert {"start", "warm", "alone", "report"} <= set(gate.seconds) and 0.25 <= gate.seconds["alone"] < 5
    gate.close()
    assert lock.state == (0, False, 0)


def test_a_gated_process_gives_the_share_up_for_host_work_and_takes_it_for_benchmarks(tmp_path):
    # the Inductor seed's child: its compile (host work) is off the GPU, the compiler's benchmarks on it
    import os
    import sys

    from kernellab.sandbox._executor import ProfileGate
    from kernellab.sandbox._profile import run_gated

    lock = RWLock()
    gate = ProfileGate("0", lock)
    script = textwrap.dedent(f"""
        import pathlib, time
        from kernellab.sandbox._profile_target import GATE_SHARE, GATE_SHARED, GpuHold, ask
        d = pathlib.Path({str(tmp_path)!r})
        ask(d, GATE_SHARE, GATE_SHARED)
        hold = GpuHold(d)
        time.sleep(0.5)            # builds the problem: shared
        with hold.off():
            time.sleep(0.5)        # compiles: nothing held
            hold.on_for(time.sleep)(0.5)  # a benchmark inside the compile: shared
            time.sleep(0.5)        # compiles on: nothing held
        time.sleep(0.5)            # runs what it compiled: shared
    """)
    run, seen = _sampled(lambda: run_gated([sys.executable, "-c", script], tmp_path, dict(os.environ), 60.0, gate),
                         lambda: lock.state[0])
    gate.close()
    assert run.returncode == 0, run.stderr
    assert seen == [0, 1, 0, 1, 0, 1], seen  # shared, off, a benchmark, off, shared to the end
    assert lock.state == (0, False, 0)  # the caller's gate gave the last share up
    assert gate.seconds["off"] >= 0.8 and gate.seconds["shared"] >= 0.9, gate.seconds


def _sampled(fn, probe):
    """``fn()``'s result, and each distinct value ``probe()`` took while it ran (sampled every 10 ms), in order."""
    seen: list = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            r = probe()
            if not seen or seen[-1] != r:
                seen.append(r)
            time.sleep(0.01)

    t = threading.Thread(target=sample)
    t.start()
    try:
        return fn(), seen
    finally:
        done.set()
        t.join()


def test_a_profile_starting_up_lets_timings_run(tmp_path):
    # the old gate took the reader's hold as ncu started: a timing waited out the whole start-up, and the readers
    # queued behind that timing waited too
    import sys

    from kernellab.sandbox._executor import ProfileGate
    from kernellab.sandbox._profile import run_gated
    from kernellab.sandbox._profile_target import GATE_SHARE, GATE_SHARED

    lock = RWLock()
    gate = ProfileGate("0", lock)
    script = (f"import pathlib, time; d = pathlib.Path({str(tmp_path)!r}); time.sleep(1.5); (d / {GATE_SHARE!r}).touch()\n"
              f"while not (d / {GATE_SHARED!r}).exists(): time.sleep(0.01)\n")
    t = threading.Thread(target=lambda: run_gated([sys.executable, "-c", script], tmp_path, {}, 30.0, gate))
    t.start()
    time.sleep(0.2)
    got = []
    timer = threading.Thread(target=lambda: (lock.acquire_write(), got.append(time.monotonic()), lock.release_write()))
    t0 = time.monotonic()
    timer.start()
    timer.join(5)
    t.join(10)
    gate.close()
    assert got and got[0] - t0 < 0.5  # the timing had the GPU while the profiled process was still starting


def test_rwlock_lets_readers_that_waited_go_before_the_next_writer(monkeypatch):
    from kernellab.sandbox import _gpu

    monkeypatch.setattr(_gpu, "WRITE_PHASE_S", 0.0)  # each write phase ends with its first writer
    lock = RWLock()
    order: list[str] = []
    lock.acquire_read()  # A: a trial in progress

    def run(name: str, mode: str) -> threading.Thread:
        def body() -> None:
            with (lock.write() if mode == "w" else lock.read()):
                order.append(name)
                time.sleep(0.05)
        t = threading.Thread(target=body)
        t.start()
        time.sleep(0.05)
        return t

    ts = [run("w1", "w"), run("r1", "r"), run("w2", "w"), run("r2", "r")]
    assert order == []  # w1 waits for A; r1, w2, r2 wait behind w1
    lock.release_read()
    for t in ts:
        t.join(5)
    # the timings still have the GPU alone, one at a time, and the trials that waited go between them
    assert order[0] == "w1" and set(order[1:3]) == {"r1", "r2"} and order[3] == "w2", order
    assert lock.state == (0, False, 0)


def _ordered(lock: RWLock, plan: list[tuple[str, str, float]]) -> list[str]:
    """Start each (name, "r"/"w", hold seconds) 50 ms apart while a reader holds ``lock``, release that
    reader, and return the order in which they got the lock."""
    order: list[str] = []
    lock.acquire_read()  # a trial in progress: everything below queues

    def body(name: str, mode: str, hold: float) -> None:
        with (lock.write() if mode == "w" else lock.read()):
            order.append(name)
            time.sleep(hold)

    ts = []
    for name, mode, hold in plan:
        ts.append(threading.Thread(target=body, args=(name, mode, hold)))
        ts[-1].start()
        time.sleep(0.05)
    lock.release_read()
    for t in ts:
        t.join(10)
    assert lock.state == (0, False, 0)
    return order


def test_rwlock_takes_the_waiting_timings_together_within_a_write_phase(monkeypatch):
    # one writer per phase made each timing wait for the longest read in flight: 1047 s of wait_read over
    # 82 evaluations in an 8-job bench on the H200
    from kernellab.sandbox import _gpu

    monkeypatch.setattr(_gpu, "WRITE_PHASE_S", 5.0)
    order = _ordered(RWLock(), [("w1", "w", 0.05), ("r1", "r", 0.05), ("w2", "w", 0.05), ("w3", "w", 0.05)])
    assert order == ["w1", "w2", "w3", "r1"], order  # the readers' turn comes when no writer is left waiting


def test_rwlock_ends_a_write_phase_at_its_bound(monkeypatch):
    from kernellab.sandbox import _gpu

    monkeypatch.setattr(_gpu, "WRITE_PHASE_S", 0.25)
    order = _ordered(RWLock(), [("w1", "w", 0.3), ("r1", "r", 0.05), ("w2", "w", 0.05), ("r2", "r", 0.05)])
    # w1 held the lock past the phase's bound: the readers that waited go before w2
    assert order[0] == "w1" and set(order[1:3]) == {"r1", "r2"} and order[3] == "w2", order


def test_rwlock_serves_writers_in_order_and_skips_one_whose_wait_was_interrupted():
    lock = RWLock()
    lock.acquire_write()
    real_wait = lock._cond.wait

    def wait(*a, **k):
        if threading.current_thread().name == "interrupted":
            raise KeyboardInterrupt  # what a stop raises in a waiting thread
        return real_wait(*a, **k)

    lock._cond.wait = wait
    order: list[str] = []
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            with lock.write():
                order.append(name)
        except KeyboardInterrupt as exc:
            errors.append(exc)

    ts = []
    for name in ("a", "interrupted", "b", "c"):
        ts.append(threading.Thread(target=writer, args=(name,), name=name))
        ts[-1].start()
        time.sleep(0.05)
    lock.release_write()
    for t in ts:
        t.join(5)
    assert order == ["a", "b", "c"] and len(errors) == 1  # first come, first served; nobody waits for the lost turn
    assert lock.state == (0, False, 0)


def test_a_running_job_hands_back_what_its_measured_need_leaves_of_its_grant():
    from kernellab.sandbox._gpu import MemoryBudget, measured_need

    b = MemoryBudget(1000)
    first = b.admit(800)  # admitted at twice the meta device's estimate: no peak measured yet
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(b.admit(500)[0]))
    t.start()
    time.sleep(0.1)
    assert got == []  # 800 + 500 > 1000
    held = b.shrink(first[0], 300)  # its reference peak measured: it needs 300
    t.join(5)
    assert held == 300 and got == [500] and b.used == 800
    assert b.shrink(held, 400) == 300  # a grant only shrinks
    b.release(held)
    b.release(500)
    assert b.used == 0
    # what a job of a problem with a measured reference peak is admitted with, and capped at
    assert measured_need(1 << 30) == 2 * (1 << 30) + (1 << 30) + (256 << 20)


def test_a_regrant_keeps_what_a_retime_and_a_retry_need():
    from kernellab.sandbox._gpu import measured_need, regrant_cap

    gib = 1 << 30
    # a re-timing times torch.compile too: one more set of fresh inputs and outputs than an evaluation
    assert measured_need(gib, compile_timed=True) == measured_need(gib) + gib
    assert regrant_cap(gib, 8 * gib) == measured_need(gib)
    assert regrant_cap(gib, 8 * gib, compile_timed=True) == measured_need(gib) + gib
    # a job retried with a larger grant after running out of memory keeps it (the old cap shrank every retry
    # back to the need that had run out, three times over)
    assert regrant_cap(gib, 6 * gib, floor=6 * gib) is None
    assert regrant_cap(gib, 8 * gib, floor=6 * gib) == 6 * gib
    assert regrant_cap(gib, 2 * gib) is None and regrant_cap(gib, None) is None  # a grant only shrinks


def test_large_reference_outputs_stay_on_the_device_while_the_grant_holds_them_once():
    from kernellab.sandbox._gpu import measured_need, need_peak
    from kernellab.sandbox._reference import KEEP_ON_DEVICE_BYTES, keeps_on_device

    gb = 10**9
    # KernelBench level 1's elementwise problems: 6.4 GB outputs, a working peak of about 19.2 GB (an input,
    # its clone, the output); a probe's grant of 70.7 GB (half the H200's budget) holds four of the six
    work, out, grant = 19_200_000_000, 6_400_000_000, 70_700_000_000
    kept = 0
    while keeps_on_device(work, kept, out, grant):
        kept += out
    assert kept == 4 * out and measured_need(work) + kept <= grant < measured_need(work) + kept + out
    # held once in the need the job reports: the rest of its peak doubles (the candidate's side), they do not
    assert measured_need(need_peak(work + kept, kept)) == measured_need(work) + kept
    assert need_peak(work) == work
    # a later job granted that need keeps as many; a re-timing's need (three times the peak) leaves less room
    assert keeps_on_device(work, 2 * out, out, measured_need(work) + kept)
    assert not keeps_on_device(work, 2 * out, out, measured_need(work) + kept, compile_timed=True)
    # small outputs go to the host, whatever the room: cheap to copy, and the worker's cache keeps them
    assert not keeps_on_device(1 << 20, 0, KEEP_ON_DEVICE_BYTES - 1, 100 * gb)
    assert keeps_on_device(1 << 20, 0, KEEP_ON_DEVICE_BYTES, 100 * gb)


def test_a_jobs_own_side_keeps_room_beside_the_outputs_it_keeps_on_the_device():
    """Session 19's H200 jobs of KernelBench's 21_Sigmoid (6.44 GB outputs): each held 51.7 GB besides the outputs
    it kept on the device, 2-trial or 5-trial, while twice its reference's working peak gave 40.1 GB."""
    from kernellab.sandbox._gpu import JOB_OVERHEAD, measured_need, need_peak, regrant_cap, side_need
    from kernellab.sandbox._reference import keeps_on_device

    gb = 10**9
    out, side, est = 6_442_450_944, 51_700_000_000, 65_867_350_016  # est: the meta device's footprint
    # the probe (admitted at 82.3 GB, nothing measured yet): with twice its working peak alone it kept six outputs
    # and ran out of memory at the check; with the footprint as its side's floor it keeps two, and fits
    work, grant = 19_400_000_000, 82_334_187_520
    kept = 0
    while keeps_on_device(work, kept, out, grant):
        kept += out
    assert kept == 6 * out and side + kept > grant
    kept = 0
    while keeps_on_device(work, kept, out, grant, side=est):
        kept += out
    assert kept == 2 * out and side + kept <= grant
    # a 2-trial job admitted at 85.3 GB keeping three outputs capped itself at twice its working peak, below the
    # 71.1 GB it then reserved (eight such jobs ran out of memory and ran again alone); the measured side keeps it
    peak, refs, grant = 38_800_000_000, 3 * out, 85_345_697_792
    old = regrant_cap(need_peak(peak, refs), grant)
    assert old is not None and old < side + refs
    cap = regrant_cap(need_peak(peak, refs), grant, least=side_need(side) + refs)
    assert cap == side_need(side) + refs and side + refs < cap < grant
    assert side_need(side) == side + side // 8 + JOB_OVERHEAD
    # a side below twice the working peak changes nothing
    assert regrant_cap(need_peak(peak, refs), grant, least=refs + gb) == old
    assert keeps_on_device(work, 0, out, measured_need(work) + out, side=measured_need(work) - 1)


def test_a_reference_print_is_the_same_in_any_chunks_and_wherever_it_is_taken():
    """The check holds each reference output to the print taken when it was computed, summed in the
    fingerprint's chunks there and in the comparison's chunks here: equal, also where the int64 sums wrap."""
    import torch

    from kernellab.sandbox._check import compare
    from kernellab.sandbox._reference import _value_prints

    for t in (torch.randn(3 << 22) * 1e30, torch.randint(-(1 << 62), 1 << 62, (1 << 21,)), torch.rand(5, 7) > 0.5,
              torch.randn(64, 33).t(), torch.randn(0)):
        (want,) = _value_prints([t])
        c = compare(t, t.clone(), 1e-5, 1e-5, sums=True)
        assert (tuple(t.shape), str(t.dtype), *c["ref_sums"]) == want
        if t.numel():
            at = tuple(n // 2 for n in t.shape)
            t[at] = ~t[at] if t.dtype == torch.bool else t[at] * 2 + 1
            (changed,) = _value_prints([t])
            assert changed != want


def test_a_prepare_job_computes_the_reference_ahead_of_the_first_evaluation():
    p = _problem("prepare")
    ex = LocalExecutor(cpu_workers=1)
    try:
        ready = ex.prepare(p, trials=2).result()
        assert ready["details"].get("prepared") is True and _ref(ready)["reused"] is False
        assert ready["median_ms"] is None and "trials" not in ready["details"]  # no candidate was run
        first = evaluate(p, RELU, trials=2, executor=ex)
        assert first["status"] == "correct" and _ref(first)["reused"] is True, first["error_text"]
    finally:
        ex.shutdown()


def test_a_busy_pool_is_not_given_a_prepare_job():
    p = _problem("prepare_busy")
    ex = LocalExecutor(cpu_workers=1)
    try:
        running = ex.submit(EvalJob(p, RELU, trials=2, timing=False))
        assert ex.prepare(p, trials=2) is None  # an evaluation is in flight: the job would only compete with it
        assert running.result()["status"] == "correct"
        time.sleep(0.1)
        assert ex.prepare(p, trials=2) is not None
    finally:
        ex.shutdown()


def test_a_gated_process_compiles_triton_without_the_share(tmp_path):
    # a profile's target and the Inductor seed (gated_share): Triton's compile is host work, run with nothing held;
    # the parent's board says what the gated run holds
    import os
    import sys

    from kernellab.sandbox._executor import ProfileGate
    from kernellab.sandbox._gpu import Board
    from kernellab.sandbox._profile import run_gated

    lock, board = RWLock(), Board()
    gate = ProfileGate("0", lock, board)
    script = textwrap.dedent(f"""
        import pathlib, time
        import triton
        from kernellab.sandbox._profile_target import gated_share
        d = pathlib.Path({str(tmp_path)!r})
        hold = gated_share(d, "cpu")
        assert getattr(triton.compile, "_kernellab_off_gpu", False)
        time.sleep(0.4)            # builds the problem: shared
        def slow(*a, **k):
            time.sleep(0.6)        # a compile's host work
        hold.off_for(slow)()       # what the wrapped compile does: the share given up around it
        time.sleep(0.4)            # runs what it compiled: shared
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run, seen = _sampled(lambda: run_gated([sys.executable, "-c", script], tmp_path, env, 120.0, gate),
                         lambda: (lock.state[0], tuple(sorted(board.counts()))))
    gate.close()
    assert run.returncode == 0, run.stderr
    reads = [r for r, _ in seen]
    # nothing while it made its context and started, shared, off for the compile, shared to its end
    assert [r for i, r in enumerate(reads) if i == 0 or r != reads[i - 1]] == [0, 1, 0, 1], seen
    assert lock.state == (0, False, 0)  # the caller's gate gave the last share up
    labels = {lab for _, labs in seen for lab in labs}
    assert {"profile:host", "profile:shared"} <= labels, seen


def _until(pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _waits(fn, timeout: float = 0.3) -> bool:
    """Whether ``fn`` (a lock acquisition) is still waiting after ``timeout``; the thread runs on."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(timeout)
    return t.is_alive()


def test_rwlock_short_reads_go_beside_a_long_read_a_writer_waits_for():
    # a gated process's share under ncu held the GPU 8-10 s for milliseconds of kernels; the timing waiting for it
    # kept every trial out meanwhile: half of an 8-job bench on the H200 was such a drain, the GPU 14-28% busy
    lock = RWLock()
    lock.acquire_read(long=True)  # a profile's warm-up under ncu
    wrote = threading.Event()
    writer = threading.Thread(target=lambda: (lock.acquire_write(), wrote.set(), lock.release_write()))
    writer.start()
    _until(lambda: lock.state[2] == 1)  # the timing waits for the long read
    assert not _waits(lock.acquire_read)  # a trial goes beside it
    assert lock.state == (2, False, 1)
    assert _waits(lambda: lock.acquire_read(long=True))  # another long read does not: it would hold the writer on
    lock.release_read(long=True)
    assert lock.long_reads == 0
    assert _waits(lock.acquire_read)  # with no long read left, new reads queue behind the writer again
    assert not wrote.is_set()  # the writer still waits for the trial that went beside the long read
    lock.release_read()
    assert wrote.wait(5)  # and then has the GPU alone, before the reads that queued behind it
    writer.join(5)
    _until(lambda: lock.state[0] == 2 and lock.long_reads == 1)  # the queued short and long reads, after it


def test_rwlock_a_writer_never_overlaps_reads_beside_a_long_one():
    lock, spans, guard = RWLock(), [], threading.Lock()

    def hold(mode: str, start: float, secs: float) -> None:
        time.sleep(start)
        acquire, release = {"w": (lock.acquire_write, lock.release_write),
                            "L": (lambda: lock.acquire_read(long=True), lambda: lock.release_read(long=True)),
                            "r": (lock.acquire_read, lock.release_read)}[mode]
        acquire()
        t0 = time.monotonic()
        time.sleep(secs)
        t1 = time.monotonic()
        release()
        with guard:
            spans.append((mode, t0, t1))

    plan = [("L", 0, 0.5), ("w", 0.05, 0.05), ("r", 0.1, 0.2), ("r", 0.2, 0.4), ("w", 0.25, 0.05), ("r", 0.6, 0.05)]
    ts = [threading.Thread(target=hold, args=p) for p in plan]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert len(spans) == len(plan) and lock.state == (0, False, 0) and lock.long_reads == 0
    for m, s0, e0 in spans:
        if m == "w":
            for other in spans:
                if other != (m, s0, e0):
                    assert e0 <= other[1] or other[2] <= s0, f"a writer overlapped {other}: {spans}"
    (l0, l1), = [(s, e) for m, s, e in spans if m == "L"]
    beside = [(s, e) for m, s, e in spans if m == "r" and s < l1]
    assert len(beside) == 2, spans  # both trials that came while the writers waited for the long read ran beside it


def test_profile_gate_share_is_a_long_read():
    from kernellab.sandbox._api import ProfileGate

    lock = RWLock()
    gate = ProfileGate("0", lock)
    gate.share()
    assert lock.long_reads == 1
    gate.unshare()
    assert lock.long_reads == 0 and lock.state == (0, False, 0)
    gate.share()
    with gate.exclusive():
        assert lock.state == (0, True, 0) and lock.long_reads == 0
    gate.share()
    gate.close()
    assert lock.state == (0, False, 0) and lock.long_reads == 0
