"""Where a pool's GPU time goes: the lock's state as a sampler files it (``RWLock.held``), what each executor
thread is doing (``Board``, ``LocalExecutor.gpu_state``) and the sampler's tally of the two
(``kernellab._busy.StateTally``, ``BusySampler(probe=...)``)."""

from __future__ import annotations

import sys
import textwrap
import threading
import time

import pytest
from test_busy import _fake_nvml

from kernellab import Problem
from kernellab._busy import BusySampler, StateTally
from kernellab.bench import md_states
from kernellab.sandbox import EvalJob, LocalExecutor
from kernellab.sandbox._gpu import Board, RWLock


def _until(pred, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_held_says_alone_drain_shared_or_none():
    lock = RWLock()
    assert lock.held() == "none"
    lock.acquire_read()
    assert lock.held() == "shared"
    got = threading.Event()

    def writer() -> None:
        lock.acquire_write()
        got.set()
        time.sleep(0.05)
        lock.release_write()

    t = threading.Thread(target=writer)
    t.start()
    _until(lambda: lock.state[2] == 1)
    assert lock.held() == "drain"  # the timing waits for the read in flight; new reads wait behind it
    lock.release_read()
    got.wait(5)
    assert lock.held() in ("alone", "none")
    t.join()
    assert lock.held() == "none"


def test_the_board_counts_each_threads_label_once():
    board = Board()
    ready, go = threading.Barrier(4), threading.Event()

    def slot(label: str) -> None:
        board.set("free")
        board.set(label)  # a thread's new label replaces its old one
        ready.wait()
        go.wait(5)
        board.set(None)

    threads = [threading.Thread(target=slot, args=(x,)) for x in ("check", "check", "wait_read")]
    for t in threads:
        t.start()
    ready.wait()
    assert board.counts() == {"check": 2, "wait_read": 1}
    go.set()
    for t in threads:
        t.join()
    assert board.counts() == {}


def test_the_tally_files_each_sample_under_its_state():
    tally = StateTally()
    tally.add([100.0], {"held": ["alone"], "doing": {"timing": 1, "wait_read": 3}, "queued": 2})
    tally.add([0.0], {"held": ["drain"], "doing": {"wait_timing_lock": 1, "check": 1, "wait_read": 2}, "queued": 0})
    tally.add([20.0], {"held": ["drain"], "doing": {"wait_timing_lock": 1, "wait_read": 4}, "queued": 0})
    tally.add([None], {"held": ["none"], "doing": {"compile": 2}, "queued": 0})  # a failed read: no util
    out = tally.summary()
    assert out["samples"] == 4 and out["queued_mean"] == 0.5
    held = out["held"]
    assert list(held) == ["drain", "alone", "none"]  # the most sampled first
    assert held["drain"]["share"] == 0.5 and held["drain"]["util"] == 10.0
    assert held["drain"]["doing"] == {"wait_read": 3.0, "wait_timing_lock": 1.0, "check": 0.5}
    assert held["alone"] == {"share": 0.25, "util": 100.0, "doing": {"wait_read": 3.0, "timing": 1.0}}
    assert held["none"]["util"] is None and held["none"]["doing"] == {"compile": 2.0}


def test_a_sampler_with_a_probe_files_nvmls_reads_under_the_locks_state(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([40.0]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    lock, board = RWLock(), Board()
    held, release = threading.Event(), threading.Event()

    def reader() -> None:  # a slot holding the GPU shared through its check
        board.set("check")
        lock.acquire_read()
        held.set()
        release.wait(10)
        lock.release_read()
        board.set(None)

    t = threading.Thread(target=reader)
    t.start()
    held.wait(5)
    s = BusySampler(interval_s=0.01, probe=lambda: {"held": [lock.held()], "doing": board.counts(), "queued": 0})
    with s:
        _until(lambda: s.summary()["samples"] >= 5)
    release.set()
    t.join()
    out = s.summary()
    st = out["states"]
    assert list(st["held"]) == ["shared"] and st["held"]["shared"]["util"] == 40.0
    assert st["held"]["shared"]["doing"] == {"check": 1.0}
    assert out["process_cpus"] is not None and out["process_cpus"] >= 0
    if out["host_cpu_busy"] is not None:  # Linux
        assert 0.0 <= out["host_cpu_busy"] <= 1.0


def test_a_sampler_without_nvml_still_files_the_probes_states(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    s = BusySampler(interval_s=0.01, probe=lambda: {"held": [], "doing": {"free": 2}, "queued": 1})
    with s:
        _until(lambda: s.tally.n >= 3)
    out = s.summary()
    assert out["busy_share"] is None and out["error"].startswith("NVML unavailable")
    assert out["states"]["held"]["none"]["util"] is None  # a CPU pool holds no GPU
    assert out["states"]["held"]["none"]["doing"] == {"free": 2.0} and out["states"]["queued_mean"] == 1.0


SLOW = Problem(name="slow_reference", source=textwrap.dedent('''
    import time
    import torch
    class Model(torch.nn.Module):
        def forward(self, x):
            time.sleep(1.5)
            return x + 1.0
    def get_inputs():
        return [torch.randn(4, 8)]
    def get_init_inputs():
        return []
'''))
PLUS_ONE = textwrap.dedent('''
    import torch
    class ModelNew(torch.nn.Module):
        def forward(self, x):
            return x + 1.0
''')


def test_the_executor_says_which_phase_each_slot_is_in():
    with LocalExecutor(cpu_workers=1) as ex:
        fut = ex.submit(EvalJob(SLOW, PLUS_ONE, device="cpu", trials=1, timing=False))
        seen: set[str] = set()

        def look() -> bool:
            seen.update(ex.gpu_state()["doing"])
            return "reference" in seen or fut.done()

        _until(look, timeout=120)
        assert "reference" in seen  # the slot's phase while the problem's slow forward runs
        state = ex.gpu_state()
        assert state["held"] == [] and state["queued"] == 0  # no GPU here; the one job is in its slot
        r = fut.result(timeout=120)
        assert r["status"] == "correct", r.get("error_text")
        _until(lambda: ex.gpu_state()["doing"] == {"free": 1}, timeout=30)


def test_the_page_shows_where_the_time_went_and_nothing_without_states():
    pace = {"host_cpu_busy": 0.62, "process_cpus": 1.35,
            "gpu_states": {"samples": 600, "queued_mean": 3.5,
                           "held": {"alone": {"share": 0.3, "util": 88.0, "doing": {"timing": 1.0, "wait_read": 4.2}},
                                    "none": {"share": 0.2, "util": None, "doing": {"compile": 2.5}}}}}
    md = "\n".join(md_states(pace))
    assert "600 samples; host CPU busy 62%, this process 1.35 CPUs, jobs waiting for a slot 3.5" in md
    assert "| alone | 30% | 88.0 | timing 1, wait_read 4.2 |" in md
    assert "| none | 20% | - | compile 2.5 |" in md
    assert md_states({"gpu_busy_share": 0.4}) == []
