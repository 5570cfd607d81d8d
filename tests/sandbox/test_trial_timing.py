"""The fields the tuner and the budgets rely on: a cheaper timing (``timing_target_ms``), an early stop
(``stop_above_ms``) and the device seconds of every evaluation (``details.gpu_s``), on the CPU.

Assertions are on recorded repetition counts and on bounds the clock must satisfy, never on speed."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from kernellab.sandbox import EvalJob, SandboxError
from kernellab.sandbox._timing import EARLY_REPS_CPU, rep_bounds

HERE = Path(__file__).resolve().parent
TRITON = (HERE / "adversarial" / "correct_triton.py").read_text()
ZEROS = (HERE / "adversarial" / "returns_zeros.py").read_text()


def test_rep_bounds_shrink_with_the_target():
    assert rep_bounds("cuda") == (300.0, 25, 2000)
    assert rep_bounds("cuda", 50.0) == (50.0, 10, 333)
    assert rep_bounds("cpu") == (1.0, 3, 20)
    target_s, lo, hi = rep_bounds("cpu", 150.0)
    assert (target_s, lo, hi) == (0.5, 3, 10)
    assert rep_bounds("cuda", 600.0) == (600.0, 25, 2000)  # a longer target: more work, same bounds
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="positive"):
            rep_bounds("cuda", bad)


def test_quick_timing_records_fewer_repetitions(sandbox_executor, problem):
    p = problem("tiny_relu")
    full = sandbox_executor.submit(EvalJob(p, TRITON, trials=2))
    quick = sandbox_executor.submit(EvalJob(p, TRITON, trials=2, timing_target_ms=50.0))
    full, quick = full.result(), quick.result()
    assert full["status"] == quick["status"] == "correct", (full["error_text"], quick["error_text"])
    tf, tq = full["details"]["timing"], quick["details"]["timing"]
    assert tf["target_ms"] is None and tq["target_ms"] == 50.0
    assert tq["candidate"]["reps"] < tf["candidate"]["reps"], (tq, tf)
    assert tq["candidate"]["reps"] == tq["eager"]["reps"] <= rep_bounds("cpu", 50.0)[2]
    # the same method: interleaved wall clock, median with p20/p80, and no early stop was asked for
    assert quick["p20_ms"] <= quick["median_ms"] <= quick["p80_ms"] and quick["eager_ms"] > 0
    assert quick["details"]["early_stopped"] is False and full["details"]["early_stopped"] is False


# (timing_target_ms, stop_above_ms, stopped): a 50 ms trial on the CPU plans EARLY_REPS_CPU
# repetitions in all, so there is nothing left to skip and its timing is complete.
@pytest.mark.parametrize("target, stop, stopped", [(150.0, 1e-6, True), (None, 1e-6, True), (150.0, 1e6, False),
                                                   (50.0, 1e-6, False)])
def test_early_stop_after_the_first_repetitions(sandbox_executor, problem, target, stop, stopped):
    r = sandbox_executor.submit(EvalJob(problem("tiny_relu"), TRITON, trials=3, timing_target_ms=target,
                                        stop_above_ms=stop)).result()
    assert r["status"] == "correct", r["error_text"]
    d = r["details"]
    c = d["timing"]["candidate"]
    assert d["early_stopped"] is stopped and c["early_stopped"] is stopped
    assert d["timing"]["stop_above_ms"] == stop
    if stopped:
        assert c["reps"] == d["timing"]["eager"]["reps"] == EARLY_REPS_CPU < c["planned_reps"]
        assert r["median_ms"] > stop  # the partial median is what stopped it
    else:
        assert c["reps"] == c["planned_reps"]
    # correctness and integrity ran in full before (and after) the timing
    assert [t["trial"] for t in d["trials"]] == [0, 1, 2] and d["follow_check"] == "passed"
    assert r["max_abs_err"] is not None and r["own_kernel_share"] > 0


def test_early_stop_does_not_spare_an_incorrect_candidate(sandbox_executor, problem):
    r = sandbox_executor.submit(EvalJob(problem("tiny_relu"), ZEROS, trials=2, timing_target_ms=150.0,
                                        stop_above_ms=1e-6)).result()
    assert r["status"] == "incorrect" and r["median_ms"] is None and "early_stopped" not in r["details"]


@pytest.mark.parametrize("field", ["timing_target_ms", "stop_above_ms"])
@pytest.mark.parametrize("value", [0, -5.0, math.nan, math.inf, "50", True])
def test_bad_timing_fields_raise(sandbox_executor, problem, field, value):
    with pytest.raises(SandboxError, match=field):
        sandbox_executor.submit(EvalJob(problem("tiny_relu"), TRITON, **{field: value}))


def test_gpu_s_is_measured_and_recorded(sandbox_executor, problem):
    from kernellab import Problem
    from kernellab.search import Usage
    from kernellab.store import Store

    t0 = time.monotonic()
    r = sandbox_executor.submit(EvalJob(problem("tiny_relu"), TRITON, trials=2, timing_target_ms=150.0)).result()
    wall = time.monotonic() - t0
    assert r["status"] == "correct", r["error_text"]
    d = r["details"]
    parts = d["gpu_s_parts"]
    assert parts["lock_s"] == 0.0  # no timing lock on the CPU: the worker's running time is all of it
    assert 0 < d["gpu_s"] == parts["run_s"] <= wall
    # the timed repetitions alone are a lower bound: at least 80% of them took p20 or longer
    timed_ms = sum(0.5 * t["reps"] * t["p20_ms"] for t in (d["timing"]["candidate"], d["timing"]["eager"]))
    assert d["gpu_s"] * 1e3 >= timed_ms

    # recorded: the store keeps it, and the budget sums it
    store = Store(":memory:")
    try:
        camp = store.create_campaign("gpu-s", {}, r["device"], {})
        pid = store.add_problem(Problem(name="tiny_relu", source=problem("tiny_relu").source, path="tiny_relu.py"))
        cid = store.add_candidate(camp, pid, TRITON, origin="human")
        store.add_evaluation(cid, r, kind="trial")
        (row,) = store.evaluations(candidate_id=cid)
        assert row["details"]["gpu_s"] == d["gpu_s"]
        assert Usage.from_store(store, camp).gpu_s == pytest.approx(d["gpu_s"])
    finally:
        store.close()


def test_device_busy_time_counts_overlapping_kernels_once():
    """The side-stream check's device busy time: the union of kernel intervals, whatever their stream."""
    from kernellab.sandbox._measure import union_length

    assert union_length([]) == 0.0
    assert union_length([(0.0, 10.0), (2.0, 5.0)]) == 10.0  # nested: another stream, same time
    assert union_length([(5.0, 8.0), (0.0, 6.0), (20.0, 21.0)]) == 9.0  # overlapping, out of order, and a gap
