"""The executor's own machinery on the CPU: the GPU reader/writer lock, memory admission against a
(fake) device budget, infrastructure failures kept apart from verdicts, the circuit breaker on worker
starts, shutdown with jobs still queued, and the profile target's dropped capabilities."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kernellab import Problem
from kernellab.sandbox import EvalJob, Limits, LocalExecutor, SandboxError, evaluate, is_infra
from kernellab.sandbox._gpu import (
    MemoryBudget,
    RWLock,
    TooBig,
    estimate,
    estimate_bytes,
    probes,
    retry_admission,
    side_need,
    unmeasured_need,
)
from kernellab.sandbox._slots import _SENTINEL, BREAKER_FAILURES, CONTEXT_BYTES, GPU_MARGIN, JobQueue, gpu_budget

ROOT = Path(__file__).resolve().parents[2]
ADV = Path(__file__).resolve().parent / "adversarial"
RELU = (ADV / "correct_torch.py").read_text()


# -- the reader/writer lock ------------------------------------------------------------------------
def _spans(lock: RWLock, plan: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """Run threads that each wait ``delay`` then hold the lock in ``mode`` for ``hold`` seconds;
    return (mode, start, end) of every hold."""
    out: list[tuple[str, float, float]] = []
    mu = threading.Lock()

    def body(mode: str, delay: float, hold: float) -> None:
        time.sleep(delay)
        with lock.read() if mode == "r" else lock.write():
            t0 = time.monotonic()
            time.sleep(hold)
            t1 = time.monotonic()
        with mu:
            out.append((mode, t0, t1))

    threads = [threading.Thread(target=body, args=p) for p in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_rwlock_readers_share_a_writer_is_alone():
    spans = _spans(RWLock(), [("r", 0, 0.3), ("r", 0, 0.3), ("r", 0, 0.3), ("w", 0.05, 0.1), ("w", 0.05, 0.1)])
    reads = [s for s in spans if s[0] == "r"]
    # the three readers held it at the same time
    assert max(s[1] for s in reads) < min(s[2] for s in reads)
    for m, s0, e0 in spans:
        if m != "w":
            continue
        for other in spans:
            if other != (m, s0, e0):
                assert e0 <= other[1] or other[2] <= s0, f"a writer overlapped {other}: {spans}"


def test_rwlock_prefers_a_waiting_writer_over_new_readers():
    lock = RWLock()
    # reader A holds it from t=0; writer W queues at 0.1; reader B arrives at 0.2, while W waits
    spans = _spans(lock, [("r", 0, 0.4), ("w", 0.1, 0.1), ("r", 0.2, 0.05)])
    reads = sorted((s, e) for m, s, e in spans if m == "r")
    (w0, w1), = [(s, e) for m, s, e in spans if m == "w"]
    (a0, a1), (b0, b1) = reads
    assert a1 <= w0, spans  # W waited for A
    assert b0 >= w1, spans  # B waited for W although only a reader held the lock when it came
    assert lock.state == (0, False, 0)


def test_rwlock_release_without_hold_is_an_error():
    lock = RWLock()
    with pytest.raises(RuntimeError):
        lock.release_read()
    with pytest.raises(RuntimeError):
        lock.release_write()


# -- memory admission ------------------------------------------------------------------------------
def test_budget_shares_a_large_job_and_refuses_one_too_big():
    b = MemoryBudget(1000)
    assert b.grant_for(400) == (400, False)
    # more than half the budget still shares: the old rule ran it alone, and one such problem kept a
    # 141 GB card at a fraction of its memory while the queue waited behind it
    assert b.grant_for(600) == (600, False)
    assert b.grant_for(None) == (1000, True)  # unknown: alone
    assert b.grant_for(5000) == (1000, True)  # a generous estimate above the budget: alone, not refused
    assert b.why_alone(5000) == "need > the budget" and b.why_alone(600) is None
    with pytest.raises(TooBig, match="budget"):
        b.admit(5000, floor=1001)  # what the reference itself holds does not fit
    assert b.used == 0
    small = b.admit(300)
    big = b.admit(600)  # both fit: admitted at once, side by side
    assert b.used == 900 and b.jobs == 2
    b.release(small[0])
    b.release(big[0])
    assert b.used == 0 and b.jobs == 0


def test_budget_backfills_around_a_waiting_large_job_a_bounded_number_of_times():
    b = MemoryBudget(1000, max_bypass=2)
    order: list[str] = []
    first = b.admit(500)

    def job(name: str, need: int, hold: float) -> threading.Thread:
        def run() -> None:
            with b.admitted(need):
                order.append(name)
                time.sleep(hold)
        t = threading.Thread(target=run)
        t.start()
        return t

    big = job("big", 800, 0.05)  # waits: 500 + 800 > 1000
    time.sleep(0.1)
    assert order == [] and b.waiting == 1
    # small jobs that fit pass the waiting one (strict first come, first served kept them waiting too)
    s1 = job("s1", 100, 0.3)
    time.sleep(0.05)
    s2 = job("s2", 100, 0.3)
    time.sleep(0.05)
    assert order == ["s1", "s2"], order
    # passed twice (max_bypass): a third small job now queues behind it, although it would fit
    s3 = job("s3", 100, 0.0)
    time.sleep(0.1)
    assert order == ["s1", "s2"], order
    b.release(first[0])
    for t in (big, s1, s2, s3):
        t.join(5)
    assert order == ["s1", "s2", "big", "s3"], order
    assert b.used == 0 and b.waiting == 0


def test_a_free_slot_takes_the_first_ready_job_and_passes_a_job_a_bounded_number_of_times():
    q = JobQueue(max_pass=2, poll=0.01)
    fits = {"small1", "small2", "small3"}
    for name in ("big", "small1", "small2", "small3"):
        q.put(name)
    ready = fits.__contains__
    assert q.get(ready) == "small1" and q.get(ready) == "small2"  # "big" waits for memory; they go past it
    assert q.get(ready) == "big"  # passed twice (max_pass): taken now, ready or not
    assert q.get(ready) == "small3" and q.qsize() == 0
    # nothing ready: the slot waits with the job still queued, and takes it once it is ready
    q.put("big")
    got: list = []
    t = threading.Thread(target=lambda: got.append(q.get(lambda item: item in fits)))
    t.start()
    t.join(0.3)
    assert t.is_alive() and not got and q.qsize() == 1
    fits.add("big")  # its memory was released
    t.join(5)
    assert got == ["big"]
    # the stop marker is never passed over; a closed queue hands jobs out in order, then the marker
    q.put("big2")
    q.put(_SENTINEL)
    assert q.get(lambda item: True) == "big2" and q.get(lambda item: False) is _SENTINEL
    q.put("late")
    q.close()
    assert q.get(lambda item: False) == "late" and q.get(lambda item: False) is _SENTINEL


def test_a_gpus_budget_leaves_room_for_the_workers_contexts_and_fragmentation():
    # the same budget whether NVML tells the card's size (a bench's first choice) or the first worker does
    assert gpu_budget(150 * GIB_, 8) == 150 * GIB_ - GPU_MARGIN - 8 * CONTEXT_BYTES
    assert gpu_budget(GIB_, 8) == GIB_  # never below one GiB


def test_a_small_job_runs_beside_a_large_one_while_another_large_one_waits_for_memory():
    # two slots, room for one large job: the second large job waits in the queue, not in a slot, so the small
    # job queued after it runs at once (a slot that took the large job first would have held its worker idle
    # until the first large job ended, and the small job with it)
    sleepy = "__import__('time').sleep({s}); return torch.relu(x * 2.0) + 1.0"
    big1, big2 = _tiny("tiny_big1", sleepy.format(s=3.0)), _tiny("tiny_big2", sleepy.format(s=3.01))
    small = _tiny("tiny_small")
    ex = LocalExecutor(cpu_workers=2, gpu_bytes=10 * GIB_)
    for p, est in ((big1, 6 * GIB_), (big2, 6 * GIB_), (small, GIB_ // 4)):
        ex._estimates[(p.id, True)] = (est, est // 4)  # each one's job need, as the meta device would give it
    try:
        assert ex.start("cpu") == 2
        done: dict[str, float] = {}

        def submit(p: Problem) -> object:
            fut = ex.submit(EvalJob(p, RELU, small=True, trials=1, timing=False))
            fut.add_done_callback(lambda f, name=p.name: done.setdefault(name, time.monotonic()))
            return fut

        f1 = submit(big1)
        until = time.monotonic() + 60
        while ex._budgets["cpu"].used == 0 and time.monotonic() < until:  # big1 holds its grant
            time.sleep(0.05)
        f2, f3 = submit(big2), submit(small)
        rs = [f.result(timeout=300) for f in (f1, f2, f3)]
        assert [r["status"] for r in rs] == ["correct"] * 3, [r["error_text"] for r in rs]
        assert done["tiny_small"] < done["tiny_big1"] < done["tiny_big2"], done
        assert rs[2]["details"]["memory"]["admission_wait_s"] < 1.0
    finally:
        ex.shutdown()


def test_budget_runs_an_unknown_need_alone():
    b = MemoryBudget(1000)
    order: list[str] = []
    small = b.admit(100)
    t = threading.Thread(target=lambda: (b.admit(None), order.append("unknown in")))
    t.start()
    time.sleep(0.1)
    assert order == []  # alone: waits until the device is empty
    b.release(small[0])
    t.join(5)
    assert order == ["unknown in"] and b.used == 1000


def test_estimate_from_the_meta_device():
    src = textwrap.dedent('''
        import torch
        n = 1 << 20
        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.ones(n))
            def forward(self, x):
                return x * self.w
        def get_inputs():
            return [torch.randn(4, n)]
        def get_init_inputs():
            return []
    ''')
    est, floor = estimate(Problem(name="meta", source=src), small=False)
    four_mib = 4 << 20
    # 2 x params + 6 x inputs + 4 x outputs + poison (4 x (in + out)) + the fingerprint's three int64
    # temporaries of the input's elements (4 Mi of them: one chunk) + 256 MiB overhead
    assert est == (2 * four_mib + 6 * 4 * four_mib + 4 * 4 * four_mib + 4 * 8 * four_mib + 24 * (4 << 20)
                   + (256 << 20))
    assert floor == four_mib + 4 * four_mib + 4 * four_mib  # params, inputs, outputs
    bad = src.replace("return x * self.w", "return x[: int(x.sum().item()) % 3]")  # data-dependent
    assert estimate_bytes(Problem(name="meta2", source=bad), small=False) is None


# -- the executor with a fake device budget --------------------------------------------------------
def _tiny(name: str = "tiny", forward: str = "return torch.relu(x * 2.0) + 1.0") -> Problem:
    return Problem(name=name, source=textwrap.dedent(f'''
        import torch
        rows = 8
        cols = 127
        class Model(torch.nn.Module):
            def forward(self, x):
                {forward}
        def get_inputs():
            return [torch.randn(rows, cols)]
        def get_init_inputs():
            return []
    '''))


def test_budget_is_an_executor_option_and_an_env_variable(monkeypatch):
    monkeypatch.setenv("KERNELLAB_GPU_BYTES", "123456789")
    ex = LocalExecutor(cpu_workers=1)
    assert ex.gpu_bytes == 123456789 and ex._budgets["cpu"].budget == 123456789
    ex.shutdown()
    monkeypatch.setenv("KERNELLAB_GPU_BYTES", "lots")
    with pytest.raises(SandboxError, match="KERNELLAB_GPU_BYTES"):
        LocalExecutor(cpu_workers=1)
    monkeypatch.delenv("KERNELLAB_GPU_BYTES")
    with pytest.raises(SandboxError, match="gpu_bytes"):
        LocalExecutor(cpu_workers=1, gpu_bytes=0)


def test_a_job_larger_than_the_budget_runs_alone_and_one_too_big_is_infra():
    p = _tiny()
    need, floor = estimate(p, small=True)
    # 0.9 of the device by the estimate: admitted at 5/4 of it (no reference peak measured; twice the
    # estimate would be more than half the budget, see unmeasured_need), which is more than the whole budget: alone
    ex = LocalExecutor(cpu_workers=2, gpu_bytes=int(need / 0.9))
    try:
        r = evaluate(p, RELU, trials=2, timing=False, executor=ex)
        assert r["status"] == "correct", r["error_text"]
        mem = r["details"]["memory"]
        assert mem["alone"] is True and mem["need_bytes"] == need * 5 // 4 and mem["grant_bytes"] == ex.gpu_bytes
        assert mem["alone_reason"] == "need > the budget" and mem["budget_bytes"] == ex.gpu_bytes
        assert not is_infra(r)
    finally:
        ex.shutdown()
    # more than the whole budget by the (generous) estimate, but the reference fits: alone, evaluated
    ex = LocalExecutor(cpu_workers=1, gpu_bytes=need - 1)
    try:
        r = evaluate(p, RELU, trials=1, timing=False, executor=ex)
        assert r["status"] == "correct" and r["details"]["memory"]["alone"] is True, r["error_text"]
    finally:
        ex.shutdown()
    ex = LocalExecutor(cpu_workers=1, gpu_bytes=floor - 1)
    try:
        t0 = time.monotonic()
        r = evaluate(p, RELU, trials=2, timing=False, executor=ex)
        assert (r["status"], r["error_class"]) == ("crash", "infra:too_big")
        assert r["details"]["infra"] is True and is_infra(r)
        assert "cannot be evaluated on this device" in r["error_text"] and "GiB" in r["error_text"]
        assert "retried_after" not in r["details"]  # deterministic: not retried
        assert time.monotonic() - t0 < 30
    finally:
        ex.shutdown()


def test_a_small_job_shares_the_device():
    p = _tiny("tiny_shared")
    need = estimate_bytes(p, small=True)
    ex = LocalExecutor(cpu_workers=2, gpu_bytes=need * 4)
    try:
        r = evaluate(p, RELU, trials=1, timing=False, executor=ex)
        assert r["status"] == "correct" and r["details"]["memory"]["alone"] is False
        # no peak measured (the CPU measures none): twice the estimate, which shares half the budget
        assert r["details"]["memory"]["grant_bytes"] == 2 * need and r["details"]["memory"]["alone_reason"] is None
        # the job's wall time by phase, as the executor saw it: each phase the job went through, no other
        ph = r["details"]["phase_s"]
        assert {"reference", "load", "compile", "follow", "kernel_share"} <= set(ph), ph
        assert "timing" not in ph and all(v >= 0 for v in ph.values())
    finally:
        ex.shutdown()


def test_an_unmeasured_need_is_bounded_by_half_the_budget_or_five_quarters_of_the_estimate():
    budget = 141_519_945_728  # the H200's budget in a bench
    # KernelBench's level-1 elementwise problems (4096 x 393216): estimated 65.9 GB, their jobs peaked at 51.7 GB.
    # At twice the estimate (131.7 GB) each one's first job waited for an empty card.
    est = 65_867_350_016
    assert unmeasured_need(est, budget) == est * 5 // 4 < budget - 51_700_000_000
    assert unmeasured_need(10 * GIB_, budget) == 20 * GIB_  # small: twice, as before
    assert unmeasured_need(40 * GIB_, budget) == budget // 2
    assert probes(budget // 4 + 1, budget) and not probes(budget // 4, budget) and not probes(None, budget)


def test_a_problems_measured_side_floors_its_jobs_need_and_what_they_keep_on_the_device():
    p = _tiny("tiny_side")
    need = estimate_bytes(p, small=True)
    ex = LocalExecutor(cpu_workers=1, gpu_bytes=need * 64)
    try:
        r = evaluate(p, RELU, trials=1, timing=False, executor=ex)
        assert r["status"] == "correct", r["error_text"]
        # nothing measured (the CPU measures no peak): the job's side floor is the meta device's footprint
        assert r["details"]["memory"]["side_bytes"] == need
        budget = ex._budgets["cpu"].budget
        first, _ = ex._need(p, True, False, budget)
        side = 8 * need
        ex._note_side((p.id, True, False), {"peak_reserved_bytes": side + 3 * need, "refs_on_device_bytes": 3 * need}, "")
        assert ex._side_floor(p, True, False) == side_need(side)
        assert ex._need(p, True, False, budget)[0] == max(first, side_need(side))
        # a re-timing's side is its own; a candidate that ran out of memory itself measures nothing of the problem's
        assert ex._side_floor(p, True, True) == need and ex._need(p, True, True, budget)[0] == first
        ex._note_side((p.id, True, False), {"peak_reserved_bytes": 40 * need}, "oom")
        assert ex._side_floor(p, True, False) == side_need(side)
        r = evaluate(p, RELU, trials=1, timing=False, executor=ex)
        assert r["details"]["memory"]["side_bytes"] == side_need(side)
        assert r["details"]["memory"]["need_bytes"] >= side_need(side)
    finally:
        ex.shutdown()


GIB_ = 1 << 30


def test_an_unmeasured_problems_large_jobs_wait_for_its_probe():
    p = _tiny("tiny_probe")
    need = estimate_bytes(p, small=True)
    ex = LocalExecutor(cpu_workers=2, gpu_bytes=need * 4)  # twice the estimate is half the budget: probes
    budget = ex._budgets["cpu"]
    key = (p.id, True)
    try:
        job = EvalJob(p, RELU, small=True, trials=1, timing=False)
        first, waited = ex._probe_turn(job, budget)
        assert first is not None and waited < 0.5  # nobody probed this problem: this job does
        got: list = []
        t = threading.Thread(target=lambda: got.append(ex._probe_turn(job, budget)))
        t.start()
        t.join(0.8)
        assert t.is_alive() and not got  # the second job waits, holding no memory
        ex._note_peak(key, need)  # the probe measured the reference's peak: the others go, with the measured need
        t.join(5)
        assert got and got[0][0] is None and got[0][1] >= 0.5
        assert ex._probe_turn(job, budget)[0] is None  # measured: no more probes
        # on the CPU no peak is measured: when the probe ends the others go with the estimate
        p2 = _tiny("tiny_probe_cpu", forward="return torch.relu(x + x) + 1.0")
        job2 = EvalJob(p2, RELU, small=True, trials=1, timing=False)
        ev, _ = ex._probe_turn(job2, budget)
        ex._end_probe((p2.id, True), ev, "cpu")
        assert ex._probe_turn(job2, budget)[0] is None
        # a small problem (its need at most a quarter of the budget) never waits for a probe
        small_ex = LocalExecutor(cpu_workers=1, gpu_bytes=need * 16)
        try:
            assert small_ex._probe_turn(job, small_ex._budgets["cpu"]) == (None, pytest.approx(0.0, abs=0.5))
        finally:
            small_ex.shutdown()
    finally:
        ex.shutdown()


def test_concurrent_jobs_of_an_unmeasured_problem_probe_once():
    p = _tiny("tiny_probe_pool", forward="return torch.relu(2.0 * x) + 1.0")
    need = estimate_bytes(p, small=True)
    ex = LocalExecutor(cpu_workers=2, gpu_bytes=need * 4)
    try:
        futs = [ex.submit(EvalJob(p, RELU, small=True, trials=1, timing=False)) for _ in range(3)]
        rs = [f.result(timeout=300) for f in futs]
        assert all(r["status"] == "correct" for r in rs), [r["error_text"] for r in rs]
        mems = [r["details"]["memory"] for r in rs]
        assert sum(m["probe"] for m in mems) == 1, mems
        assert all(m["probe_wait_s"] >= 0 for m in mems)
    finally:
        ex.shutdown()


# -- infrastructure failures -----------------------------------------------------------------------
def test_reference_out_of_memory_is_infra_retried_once_never_the_verdict(sandbox_executor):
    # the reference allocates far beyond the CPU worker's address-space limit (8 GB)
    p = _tiny("ref_oom", forward="return x + torch.empty(4 << 30, dtype=torch.float32)[:1].sum() * 0")
    r = evaluate(p, RELU, trials=2, timing=False, executor=sandbox_executor)
    assert (r["status"], r["error_class"]) == ("crash", "infra:oom"), (r["error_class"], r["error_text"])
    assert r["details"]["infra"] is True and is_infra(r)
    assert "reference" in r["error_text"]
    assert r["details"]["retried_after"]["error_class"] == "infra:oom"


def test_reference_outputs_the_host_has_no_room_for_are_an_infra_oom_not_a_host_out_of_memory(monkeypatch):
    # A host out of memory takes the whole machine; a job that would leave less than the host's floor free by
    # keeping its reference outputs there fails as ours (infra:oom), retried alone, never kept anyway. Here
    # the floor (read by the worker, from its environment) is more memory than any host has.
    monkeypatch.setenv("KERNELLAB_SANDBOX_HOST_FLOOR_BYTES", str(1 << 60))
    p = _tiny("host_floor")
    ex = LocalExecutor(cpu_workers=1, gpu_bytes=estimate_bytes(p, small=True) * 8)  # the admission's rules apply
    try:
        r = evaluate(p, RELU, trials=2, timing=False, executor=ex)
    finally:
        ex.shutdown()
    assert (r["status"], r["error_class"]) == ("crash", "infra:oom"), (r["status"], r["error_text"])
    assert "host memory: keeping" in r["error_text"] and "KERNELLAB_SANDBOX_HOST_FLOOR_BYTES" in r["error_text"]
    assert r["details"]["retried_after"]["error_class"] == "infra:oom"
    assert r["details"]["memory"]["alone"] is True and len(r["details"]["retries"]) == 2


def test_a_host_floor_that_is_not_a_number_of_bytes_is_refused_before_any_worker_starts(monkeypatch):
    for bad in ("8GB", "-1", "", "inf", "nan"):
        monkeypatch.setenv("KERNELLAB_SANDBOX_HOST_FLOOR_BYTES", bad)
        with pytest.raises(SandboxError, match="KERNELLAB_SANDBOX_HOST_FLOOR_BYTES must be a number of bytes"):
            LocalExecutor(cpu_workers=1)


def test_host_room_reads_the_kernels_count_and_keeps_a_sixteenth_free(tmp_path, monkeypatch):
    from kernellab.sandbox._reference import host_memory, host_short

    monkeypatch.delenv("KERNELLAB_SANDBOX_HOST_FLOOR_BYTES", raising=False)
    info = tmp_path / "meminfo"
    gib_kb = 1 << 20
    info.write_text(f"MemTotal:       {128 * gib_kb} kB\nMemFree:        {5 * gib_kb} kB\n"
                    f"MemAvailable:   {40 * gib_kb} kB\n")
    assert host_memory(str(info)) == (40 << 30, 128 << 30)
    assert host_short(32 << 30, str(info)) is None  # 8 GiB left: the floor of a 128 GiB host
    short = host_short((32 << 30) + 1, str(info))
    assert short and "of the host's 128.0 GiB free, under its 8.00 GiB floor" in short
    info.write_text(f"MemTotal: {48 * gib_kb} kB\nMemAvailable: {10 * gib_kb} kB\n")
    assert host_short(6 << 30, str(info)) is None and host_short((6 << 30) + 1, str(info))  # at least 4 GiB
    info.write_text(f"MemTotal: {16 * gib_kb} kB\nMemAvailable: {3 * gib_kb} kB\n")
    assert host_short(1 << 30, str(info)) is None and host_short((1 << 30) + 1, str(info))  # or an eighth
    info.write_text("MemTotal: 1 kB\n")  # an old kernel without MemAvailable: unknown, not refused
    assert host_memory(str(info)) is None and host_short(1 << 50, str(info)) is None


def test_candidate_out_of_memory_stays_the_candidates(sandbox_executor):
    p = _tiny("cand_oom")
    r = evaluate(p, (ADV / "oom_cpu.py").read_text(), trials=1, timing=False, executor=sandbox_executor)
    assert (r["status"], r["error_class"]) == ("runtime_error", "oom")
    assert not is_infra(r)


def test_worker_start_failures_open_the_circuit_breaker():
    # a startup limit no worker meets: each start really launches a worker and gives up on it
    ex = LocalExecutor(cpu_workers=1, limits=Limits(startup=0.01))
    try:
        t0 = time.monotonic()
        futs = [ex.submit(EvalJob(_tiny(), RELU, trials=1, timing=False)) for _ in range(4)]
        rs = [f.result(timeout=120) for f in futs]
        assert all(r["status"] == "crash" and r["error_class"] == "worker_start" and is_infra(r) for r in rs)
        assert "failed to start" in rs[0]["error_text"]
        assert not rs[0]["details"].get("breaker")
        assert all(r["details"].get("breaker") for r in rs[1:]), [r["details"] for r in rs]
        assert "circuit breaker" in rs[-1]["error_text"]
        # no start attempt after the breaker opened: later jobs are answered at once
        assert ex.start_attempts == BREAKER_FAILURES
        assert time.monotonic() - t0 < 60
    finally:
        ex.shutdown()


def test_a_job_queued_at_shutdown_is_answered_shutdown():
    sleeper = textwrap.dedent('''
        import os, time
        import torch
        class ModelNew(torch.nn.Module):
            def forward(self, x):
                time.sleep(3)
                os._exit(9)
    ''')
    ex = LocalExecutor(cpu_workers=1)
    assert ex.start("cpu", timeout=300) == 1
    first = ex.submit(EvalJob(_tiny(), sleeper, trials=1, timing=False))
    queued = ex.submit(EvalJob(_tiny(), RELU, trials=1, timing=False))
    time.sleep(1.0)  # the first job is in the candidate's sleep; the second waits in the queue
    ex.shutdown()
    r1 = first.result(timeout=60)
    assert (r1["status"], r1["error_class"]) == ("crash", "exit:9")
    r2 = queued.result(timeout=60)
    assert (r2["status"], r2["error_class"]) == ("crash", "shutdown") and is_infra(r2)


@pytest.fixture(scope="module")
def regenerating_executor():
    """Workers that keep no trial's inputs: every read regenerates them from their seeds (what a GPU
    worker does for inputs over KEEP_INPUTS_BYTES)."""
    mp = pytest.MonkeyPatch()
    # read by each worker at its start: set while this executor may replace a worker (after a rejection)
    mp.setenv("KERNELLAB_SANDBOX_KEEP_INPUTS_BYTES", "0")
    ex = LocalExecutor(cpu_workers=2)
    yield ex
    ex.shutdown()
    mp.undo()


@pytest.mark.parametrize("name, status, error_class", [
    ("correct_torch", "correct", None),
    ("modifies_inputs", "rejected", "integrity:inputs_modified"),
    ("aliases_earlier_output", "rejected", "integrity:output_aliases_earlier_output"),
    ("stale_memory", "rejected", "integrity:stale_memory"),
])
def test_checks_hold_with_regenerated_inputs(regenerating_executor, problem, name, status, error_class):
    r = evaluate(problem("tiny_relu"), (ADV / f"{name}.py").read_text(), trials=3, timing=True,
                 executor=regenerating_executor)
    assert (r["status"], r["error_class"]) == (status, error_class), r["error_text"]


def test_inputs_not_reproducible_from_the_seed_are_the_problems_fault(regenerating_executor):
    p = Problem(name="unseeded", source=textwrap.dedent('''
        import random
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x * 2.0) + 1.0
        def get_inputs():
            return [torch.full((4, 8), random.random())]
        def get_init_inputs():
            return []
    '''))
    r = evaluate(p, RELU, trials=1, timing=False, executor=regenerating_executor)
    assert (r["status"], r["error_class"]) == ("runtime_error", "problem")
    assert "same seed" in r["error_text"]


def test_exclusive_gpu_without_a_gpu_yields_none():
    ex = LocalExecutor(cpu_workers=1)
    with ex.exclusive_gpu(_tiny()) as gpu:
        assert gpu is None
    ex.shutdown()


# -- profiling runs the candidate with the dropped capabilities ------------------------------------
def _cap_eff(status: str) -> int:
    line = next(ln for ln in status.splitlines() if ln.startswith("CapEff:"))
    return int(line.split()[1], 16)


def test_profile_target_drops_inspect_capabilities(tmp_path):
    from kernellab.sandbox._env import _INSPECT_CAPS

    mine = _cap_eff(Path("/proc/self/status").read_text())
    if not any(mine >> c & 1 for c in _INSPECT_CAPS):
        pytest.skip("this process holds none of CAP_SYS_PTRACE/SYS_ADMIN/PERFMON: nothing to drop")
    # the problem's module runs inside the target before any CUDA work: it records the capabilities
    problem = Problem(name="caps", source=textwrap.dedent('''
        import torch
        with open("caps.txt", "w") as f:
            f.write(open("/proc/self/status").read())
        class Model(torch.nn.Module):
            def forward(self, x):
                return x
        def get_inputs():
            return [torch.randn(2)]
        def get_init_inputs():
            return []
    '''))
    (tmp_path / "job.pkl").write_bytes(pickle.dumps({"problem": problem, "source": RELU, "config": None,
                                                     "small": True}))
    subprocess.run([sys.executable, "-m", "kernellab.sandbox._profile_target", str(tmp_path)], cwd=ROOT,
                   capture_output=True, text=True, timeout=300)
    caps = _cap_eff((tmp_path / "caps.txt").read_text())
    assert not any(caps >> c & 1 for c in _INSPECT_CAPS), hex(caps)


def test_a_problem_without_an_estimate_runs_alone_and_says_why():
    # .item() has no value on the meta device: no footprint, so the job is admitted alone, and its
    # result names the failure (a pool that does not overlap is otherwise a mystery)
    p = _tiny("tiny_no_estimate", forward="return x * float(x.abs().max().item() > -1.0)")
    ex = LocalExecutor(cpu_workers=1, gpu_bytes=1 << 30)
    try:
        r = evaluate(p, RELU.replace("torch.relu(x * 2.0) + 1.0", "x * 1.0"), trials=1, timing=False, executor=ex)
        mem = r["details"]["memory"]
        assert mem["alone"] is True and mem["need_bytes"] is None and mem["alone_reason"] == "no estimate", mem
        assert mem["estimate_error"] and "meta" in mem["estimate_error"].lower(), mem
        assert mem["admission_wait_s"] >= 0
    finally:
        ex.shutdown()


# -- retries after running out of memory while sharing ---------------------------------------------
GB = 10**9


def test_retry_after_a_shared_out_of_memory_doubles_the_grant_and_keeps_sharing():
    # bench_sandbox on an H200: every pool job's first attempt ran out of its 1.2 GB grant, and each
    # retry took the whole 135 GB budget alone, one after another (8 jobs: 0.59x of sequential)
    budget = 135 * GB
    assert retry_admission("oom", False, "cuda", False, int(1.2 * GB), budget, 1) == (False, int(2.4 * GB), None)
    assert retry_admission("infra:oom", True, "cuda", False, int(1.2 * GB), budget, 1) == (False, int(2.4 * GB), None)
    # out of memory again while sharing: alone, so an oom verdict is only ever given with the whole device
    assert retry_admission("oom", False, "cuda", False, int(2.4 * GB), budget, 2) == (True, None, "retry after oom")
    # twice the grant is more than half the budget: alone at once
    assert retry_admission("oom", False, "cuda", False, 40 * GB, budget, 1) == (True, None, "retry after oom")
    # alone already: the candidate's oom is its verdict; ours is retried once (alone), then stands
    assert retry_admission("oom", False, "cuda", True, budget, budget, 1) is None
    assert retry_admission("infra:oom", True, "cuda", True, budget, budget, 1) == (True, None, "retry after infra:oom")
    assert retry_admission("infra:oom", True, "cuda", True, budget, budget, 2) is None
    # a bug of ours: once, alone; a candidate's failure or an unretried infra class: never
    assert retry_admission("sandbox", True, "cuda", False, GB, budget, 1) == (True, None, "retry after sandbox")
    assert retry_admission("sandbox", True, "cuda", True, budget, budget, 2) is None
    assert retry_admission("runtime", False, "cuda", False, GB, budget, 1) is None
    assert retry_admission("infra:too_big", True, "cuda", False, GB, budget, 1) is None
    # on the CPU a candidate's MemoryError is its own address-space limit, never retried
    assert retry_admission("oom", False, "cpu", False, GB, budget, 1) is None
    # alone, but beside reference outputs the job kept on the device (45 GB of them when KernelBench's
    # InstanceNorm winner ran out on the H200): that memory was ours, so once more alone (keeping none)
    for cls, infra in (("oom", False), ("infra:oom", True)):
        assert retry_admission(cls, infra, "cuda", True, budget, budget, 3, refs_on_device=45 * GB) == (
            True, None, f"retry after {cls} beside reference outputs kept on the device")
    assert retry_admission("runtime", False, "cuda", True, budget, budget, 3, refs_on_device=45 * GB) is None


def test_pool_retries_a_shared_out_of_memory_sharing_with_twice_the_grant_and_learns_it():
    # the reference's own allocation fails (infra:oom) under a budget with room for 8 such jobs: the
    # first retry shares with twice the grant, the second runs alone; the problem's next job starts
    # with the doubled grant. Before, the first retry already took the whole budget alone.
    p = _tiny("ref_oom_shared", forward="return x + torch.empty(4 << 30, dtype=torch.float32)[:1].sum() * 0")
    need = estimate_bytes(p, small=True)
    ex = LocalExecutor(cpu_workers=1, gpu_bytes=need * 8)
    try:
        r = evaluate(p, RELU, trials=1, timing=False, executor=ex)
        assert (r["status"], r["error_class"]) == ("crash", "infra:oom"), (r["error_class"], r["error_text"])
        tries = r["details"]["retries"]
        assert [(t["error_class"], t["grant_bytes"], t["alone"]) for t in tries] == [
            ("infra:oom", 2 * need, False), ("infra:oom", 4 * need, False)], tries
        mem = r["details"]["memory"]
        assert mem["alone"] is True and mem["alone_reason"] == "retry after infra:oom", mem
        assert r["details"]["retried_after"]["error_class"] == "infra:oom"
        assert ex._need(p, True, False, ex.gpu_bytes)[0] == 4 * need  # the next job of the problem is admitted with it
    finally:
        ex.shutdown()


def test_a_failure_of_ours_while_measuring_the_baseline_hands_the_measuring_on():
    """Every later job of a problem waits on the torch.compile baseline its first GPU job measures. When that job
    failed in the executor itself (here: the worker's pipe broke on send), the baseline's future stayed unresolved
    and cached, and every later job of the problem waited for good. The GPU path is driven with a worker whose
    connection fails, since no CUDA worker can start here."""

    class BrokenConn:
        def send(self, msg):
            raise BrokenPipeError("the worker's pipe is gone")

    class CudaWorkerStandIn:
        kind = "cuda"
        info = {"versions": {"torch": "x"}, "device": "H200"}
        conn = BrokenConn()
        ref_digests: dict = {}

        def log_size(self):
            return 0

    ex = LocalExecutor(cpu_workers=1)
    try:
        job = EvalJob(_tiny(), "pass", timing=True)
        with pytest.raises(BrokenPipeError):
            ex._run(CudaWorkerStandIn(), job, "0")
        assert ex._baselines == {}  # the next job of the problem measures it
        fut, need = ex._baseline_future(job, "k")
        assert need is True
    finally:
        ex.shutdown()


def test_the_executor_interface_has_what_campaigns_and_tuners_ask_of_it():
    # callers no longer probe an executor with getattr: an executor with no GPU of its own here answers alike
    from kernellab.sandbox import Executor

    class Elsewhere(Executor):  # the least an executor writes: submit and shutdown
        def submit(self, job):
            raise NotImplementedError

        def shutdown(self, wait=True):
            return None

    ex = Elsewhere()
    p = _tiny("tiny_interface", forward="return torch.relu(x * 2.0) + 1.0 + 0.0")
    assert ex.prepare(p, small=True, device="cuda", trials=2) is None
    with ex.profiling(p, small=True) as gate:
        assert gate.gpu is None
    assert ex.remote_profile(p, "src") is None and ex.slots("cuda") == 1 and ex.warm("cuda") is None
    assert ex.runs_here() is False  # a result recorded on this host does not stand for one it computes
    local = LocalExecutor(cpu_workers=3)
    try:
        assert local.slots("cpu") == 3 and local.remote_profile(p, "src") is None and local.runs_here()
    finally:
        local.shutdown()
