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
                            t.zero_()
            return torch.relu(x * 2.0) + 1.0
''')


def _problem(name: str = "reuse") -> Problem:
    return Problem(name=name, source=textwrap.dedent('''
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x * 2.0) + 1.0
        def get_inputs():
            return [torch.randn(8, 127)]
        def get_init_inputs():
            return []
    '''))


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
        # it zeroed the outputs its own trials were judged against: not correct
        assert bad["status"] != "correct", bad
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
    from kernellab.sandbox._profile import _run_gated
    from kernellab.sandbox._profile_target import GATE_DONE, GATE_GO, GATE_READY

    lock = RWLock()
    gate = ProfileGate("0", lock)
    assert lock.state == (1, False, 0)  # start-up and warm-up: shared, like a job's correctness work
    seen = {}
    # a stand-in for ncu + its target: warms up, waits for the GPU, profiles, finishes, then writes its report
    script = (f"import pathlib, time; d = pathlib.Path({str(tmp_path)!r}); time.sleep(0.3); (d / {GATE_READY!r}).touch()\n"
              f"while not (d / {GATE_GO!r}).exists(): time.sleep(0.01)\n"
              f"time.sleep(0.3); (d / {GATE_DONE!r}).touch(); time.sleep(0.3); print('report')")

    def watch() -> None:
        for _ in range(150):
            seen.setdefault(lock.state, time.monotonic())
            time.sleep(0.01)

    t = threading.Thread(target=watch)
    t.start()
    run = _run_gated([sys.executable, "-c", script], tmp_path, {}, 30.0, gate)
    t.join()
    assert run.returncode == 0 and "report" in run.stdout
    assert (0, True, 0) in seen  # alone for the profiled forward
    assert seen[(1, False, 0)] < seen[(0, True, 0)]  # shared before it
    assert lock.state == (0, False, 0)  # neither held after the forward: the report needs no GPU
    gate.close()
    assert lock.state == (0, False, 0)


def test_rwlock_lets_readers_that_waited_go_before_the_next_writer():
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
