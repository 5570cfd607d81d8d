"""Winners re-timed in a fresh job, and that re-timing is the number every command prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernellab import Problem
from kernellab.campaign import CampaignConfig, retime_winners, run_campaign, start_campaign
from kernellab.campaign.retime import _band
from kernellab.cli import main
from kernellab.search import Tree
from kernellab.store import WINNER_RETIME, Store

ROOT = Path(__file__).resolve().parents[2]
AFFINE = ROOT / "tests" / "agents" / "affine_problem.py"

GOOD = '''import torch
import triton
import triton.language as tl


@triton.jit
def affine_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        affine_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
        return y
'''
WRONG = GOOD.replace("* 2.0 + 1.0", "* 2.0 + 1.5")


def _affine_campaign(tmp_path: Path, name: str) -> tuple[Store, str, str]:
    """A CPU campaign over the affine problem, its candidates and evaluations written by the test."""
    store = Store(tmp_path / "k.db")
    pid = store.add_problem(Problem(name="affine", source=AFFINE.read_text(), path=str(AFFINE)))
    cid = store.create_campaign(name, {"problem_ids": [pid], "objective": "speedup_eager", "trials": 2,
                                       "device": "cpu", "problems": [str(AFFINE)]}, "cpu", {})
    return store, pid, cid


def _timed(median: float, speedup: float | None = None, **kw) -> dict:
    """A correct evaluation's result dict as the sandbox writes it (GPU-like unless interpreted)."""
    r = {"status": "correct", "median_ms": median, "p20_ms": median * 0.9, "p80_ms": median * 1.1,
         "eager_ms": None if speedup is None else median * speedup, "speedup_eager": speedup,
         "interpreted": speedup is None, "device": "test"}
    r.update(kw)
    return r


def test_a_campaign_ends_with_its_winner_retimed_and_status_prints_it(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    store = Store(db)
    cid = start_campaign(store, CampaignConfig(problems=[str(AFFINE)], budget=2, width=1, trials=2), name="rt")
    summary = run_campaign(store, cid)
    sel = store.best(cid)[0]
    retimes = [e for e in store.evaluations(candidate_id=sel["candidate_id"], kind="retime")
               if (e["details"] or {}).get(WINNER_RETIME)]
    assert len(retimes) == 1, "the winner was not re-timed once"
    rt = retimes[0]
    assert rt["status"] == "correct" and rt["id"] != sel["id"] and rt["config"] == sel["config"]
    assert rt["details"][WINNER_RETIME]["selected"] == sel["id"]
    band = rt["details"][WINNER_RETIME]["band"]
    # CPU: interpreted, so never a speedup and never a win, whatever the times say
    assert rt["interpreted"] and band["win_eager"] is None and band["win_compile"] is None
    assert band["eager"]["p20_ms"] is not None and band["compile"] is None  # compile is not timed on the CPU

    res = CliRunner().invoke(main, ["status", "rt", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    best = json.loads(res.output)["best"][0]
    assert best == summary["best"][0]
    assert best["evaluation_id"] == rt["id"] and best["kind"] == "retime" and best["retimed"] is True
    assert (best["median_ms"], best["p20_ms"], best["p80_ms"]) == (rt["median_ms"], rt["p20_ms"], rt["p80_ms"])
    assert best["speedup_eager"] is None and best["speedup_eager_p20_p80"] is None and best["win_eager"] is None

    # resuming the finished campaign re-times nothing twice; --force on demand adds one more
    run_campaign(store, cid)
    assert retime_winners(store, cid)[0]["outcome"] == "re-timed before"
    n_before = len(store.evaluations(campaign_id=cid))
    res = CliRunner().invoke(main, ["retime", "rt", "--db", str(db), "--force", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["retime"][0]["outcome"] == "re-timed" and len(store.evaluations(campaign_id=cid)) == n_before + 1
    assert out["best"][0]["evaluation_id"] == out["retime"][0]["evaluation_id"] != rt["id"]  # the latest

    # export and the report print the re-timed numbers too
    res = CliRunner().invoke(main, ["export", "rt", "--db", str(db), "-o", str(tmp_path / "best.py"), "--json"])
    assert res.exit_code == 0, res.output
    exp = json.loads(res.output)
    assert exp["evaluation"] == out["best"][0]["evaluation_id"] and exp["retimed"] is True
    assert "re-timed in a fresh job" in (tmp_path / "best.py").read_text()
    store.close()


def test_a_winner_that_fails_its_recheck_is_out_and_the_next_is_retimed(tmp_path: Path) -> None:
    """The store says WRONG was correct and fastest (as a flaky check might have); its fresh job says
    otherwise, so it is out of the selection and the next best is re-timed and reported."""
    from kernellab.sandbox import LocalExecutor

    store, pid, cid = _affine_campaign(tmp_path, "flaky")
    wrong = store.add_candidate(cid, pid, WRONG, origin="seed")
    good = store.add_candidate(cid, pid, GOOD, origin="seed")
    store.add_evaluation(wrong, _timed(1.0), kind="full")
    good_full = store.add_evaluation(good, _timed(2.0), kind="full")
    assert store.best(cid)[0]["candidate_id"] == wrong
    with LocalExecutor(cpu_workers=1) as ex:
        outcomes = retime_winners(store, cid, executor=ex)
    assert outcomes == [{"problem": "affine", "candidate_id": good, "status": "correct",
                         "evaluation_id": outcomes[0]["evaluation_id"], "outcome": "re-timed"}]
    failed = store.evaluations(candidate_id=wrong, kind="retime")
    assert len(failed) == 1 and failed[0]["status"] == "incorrect"
    rep = store.reported_best(cid)[0]
    assert rep["candidate_id"] == good and rep["retimed"] and rep["selected_id"] == good_full
    assert store.summary(cid)["best"][0]["candidate_id"] == good
    store.close()


def test_a_winner_that_ran_out_beside_our_reference_outputs_stays_and_is_retimed_again(tmp_path: Path) -> None:
    """A winner's re-timing that ran out of memory while its job kept the sandbox's own reference outputs on the
    device (the H200 rows of 34_InstanceNorm and 35_GroupNorm_, written before the sandbox retried such jobs) says
    nothing about the candidate: it stays in the selection, is re-timed again under a fresh evaluation id, and
    counts as neither a re-timing nor a failed one. The same failure with none of ours there puts it out."""
    from kernellab.campaign import retimes_missing
    from kernellab.sandbox import LocalExecutor
    from kernellab.vocab import best_evaluation

    store, pid, cid = _affine_campaign(tmp_path, "ours")
    good = store.add_candidate(cid, pid, GOOD, origin="seed")
    other = store.add_candidate(cid, pid, GOOD + "\n# slower\n", origin="seed")
    good_full = store.add_evaluation(good, _timed(1.0), kind="full")
    store.add_evaluation(other, _timed(2.0), kind="full")
    oom = {"status": "runtime_error", "error_class": "oom", "config": {}, "id": store.evaluation_id(good, {}, "retime:winner:0"),
           "details": {WINNER_RETIME: {"selected": good_full}, "memory": {"refs_on_device_bytes": 45 * 10**9}}}
    store.add_evaluation(good, oom, kind="retime")
    assert store.best(cid)[0]["candidate_id"] == good
    assert best_evaluation(store.evaluations(campaign_id=cid))["candidate_id"] == good  # the vocabulary agrees
    assert retimes_missing(store, store.get_campaign(cid)) == [pid]
    with LocalExecutor(cpu_workers=1) as ex:
        outcomes = retime_winners(store, cid, executor=ex)
    assert [(o["candidate_id"], o["outcome"]) for o in outcomes] == [(good, "re-timed")]
    assert outcomes[0]["evaluation_id"] != oom["id"]
    assert store.reported_best(cid)[0]["retimed"] and retimes_missing(store, store.get_campaign(cid)) == []

    # the candidate's own out-of-memory (no outputs of ours on the device) is its verdict: out
    (tmp_path / "own").mkdir()
    store2, pid2, cid2 = _affine_campaign(tmp_path / "own", "own")
    good2 = store2.add_candidate(cid2, pid2, GOOD, origin="seed")
    other2 = store2.add_candidate(cid2, pid2, GOOD + "\n# slower\n", origin="seed")
    full2 = store2.add_evaluation(good2, _timed(1.0), kind="full")
    store2.add_evaluation(other2, _timed(2.0), kind="full")
    store2.add_evaluation(good2, {**oom, "id": "own-oom", "details": {WINNER_RETIME: {"selected": full2}, "memory": {}}},
                          kind="retime")
    assert store2.best(cid2)[0]["candidate_id"] == other2
    assert best_evaluation(store2.evaluations(campaign_id=cid2))["candidate_id"] == other2
    store.close()
    store2.close()


def test_a_winner_that_is_no_kernel_win_brings_the_best_kernel_win_along(tmp_path: Path) -> None:
    """The fastest candidate is library-only (what a user is given); a benchmark counts the best kernel win, so
    that one is re-timed too, and a finished campaign that lacks it says so (``retimes_missing``)."""
    from kernellab.campaign import retimes_missing
    from kernellab.sandbox import LocalExecutor

    store, pid, cid = _affine_campaign(tmp_path, "lib")
    lib = store.add_candidate(cid, pid, GOOD + "\n# the library's\n", origin="seed")
    own = store.add_candidate(cid, pid, GOOD, origin="seed")
    store.add_evaluation(lib, _timed(1.0, library_only=True), kind="full")
    store.add_evaluation(own, _timed(2.0), kind="full")
    camp = store.get_campaign(cid)
    assert store.best(cid)[0]["candidate_id"] == lib and store.best(cid, kernel=True)[0]["candidate_id"] == own
    assert retimes_missing(store, camp) == [pid]
    with LocalExecutor(cpu_workers=1) as ex:
        outcomes = retime_winners(store, cid, executor=ex)
    assert [(o["candidate_id"], o["outcome"], o.get("selection")) for o in outcomes] == [
        (lib, "re-timed", None), (own, "re-timed", "kernel win")]
    assert store.reported_best(cid, kernel=True)[0]["retimed"] and store.reported_best(cid)[0]["retimed"]
    assert retimes_missing(store, camp) == []
    with LocalExecutor(cpu_workers=1) as ex:  # both re-timed before: nothing runs
        again = retime_winners(store, cid, executor=ex)
    assert [o["outcome"] for o in again] == ["re-timed before", "re-timed before"]
    store.close()


def test_a_winner_that_is_a_kernel_win_is_retimed_once(tmp_path: Path) -> None:
    from kernellab.sandbox import LocalExecutor

    store, pid, cid = _affine_campaign(tmp_path, "own")
    own = store.add_candidate(cid, pid, GOOD, origin="seed")
    store.add_evaluation(own, _timed(1.0), kind="full")
    with LocalExecutor(cpu_workers=1) as ex:
        outcomes = retime_winners(store, cid, executor=ex, force=True)
    assert [(o["candidate_id"], o["outcome"]) for o in outcomes] == [(own, "re-timed")]
    assert len(store.evaluations(candidate_id=own, kind="retime")) == 1  # not again for the kernel-win rule
    store.close()


def test_reported_best_is_the_retiming_and_the_selection_ignores_it(tmp_path: Path) -> None:
    store = Store(":memory:")
    problem = Problem(name="affine", source=AFFINE.read_text(), path=str(AFFINE))
    pid = store.add_problem(problem)
    cid = store.create_campaign("c", {"problem_ids": [pid], "objective": "speedup_compile"}, "gpu", {})
    a = store.add_candidate(cid, pid, GOOD, origin="seed")
    b = store.add_candidate(cid, pid, WRONG, origin="seed")
    lib = store.add_candidate(cid, pid, GOOD + "\n# library\n", origin="seed")
    a_full = store.add_evaluation(a, _timed(1.0, 3.0, compile_ms=2.0, speedup_compile=2.0), kind="full")
    store.add_evaluation(b, _timed(1.2, 2.5, compile_ms=2.4, speedup_compile=2.0 * 0.99), kind="full")
    store.add_evaluation(lib, _timed(0.5, 6.0, compile_ms=4.0, speedup_compile=8.0, library_only=True), kind="full")
    assert store.reported_best(cid)[0]["candidate_id"] == lib  # a library-only winner, unless asked otherwise
    assert store.reported_best(cid, library=False)[0]["candidate_id"] == a
    # a's re-timing in a fresh job: slower than its best evaluation (noise favoured it), band overlapping
    result = _timed(1.6, 1.25, compile_ms=2.0, speedup_compile=1.25, p20_ms=1.5, p80_ms=1.7,
                    details={"timing": {"eager": {"median_ms": 2.0, "p20_ms": 1.9, "p80_ms": 2.1},
                                        "compile": {"median_ms": 2.0, "p20_ms": 1.65, "p80_ms": 2.2}}})
    band = _band(result)
    assert band["win_eager"] is True and band["win_compile"] is False  # p80 1.7 < 1.9, but not < 1.65
    result["details"][WINNER_RETIME] = {"selected": a_full, "band": band}
    result["id"] = "a-retime"
    store.add_evaluation(a, result, kind="retime")

    rep = store.reported_best(cid, library=False)[0]
    assert rep["id"] == "a-retime" and rep["retimed"] and rep["selected_id"] == a_full
    assert rep["objective"] == "speedup_compile" and rep["speedup_compile"] == 1.25
    assert rep["speedup_compile_p20_p80"] == pytest.approx([2.0 / 1.7, 2.0 / 1.5])
    assert (rep["win_eager"], rep["win_compile"], rep["win"]) == (True, False, False)
    assert (rep["compile_p20_ms"], rep["eager_p20_ms"]) == (1.65, 1.9)
    # the selection is unchanged by the re-timing, and the tree does not score it
    assert store.best(cid, objective="speedup_compile", library=False)[0]["id"] == a_full
    assert Tree(store, cid, pid, objective="speedup_compile")[a].best["id"] == a_full
    assert _band({**result, "interpreted": True})["win_eager"] is None  # interpreted: never a win


def test_interpreted_band_and_missing_baselines_are_not_wins() -> None:
    r = _timed(1.0, 2.0, p80_ms=1.1, details={"timing": {"eager": {"median_ms": 2.0, "p20_ms": 1.8, "p80_ms": 2.2}}})
    assert _band(r)["win_eager"] is True and _band(r)["win_compile"] is None  # compile not measured
    assert _band({**r, "status": "incorrect"})["win_eager"] is None


@pytest.mark.gpu
def test_retime_job_times_compile_with_the_candidate(tmp_path: Path) -> None:
    """On CUDA a re-timing job compiles and times torch.compile itself, interleaved with the candidate
    and eager: its speedup_compile is a same-job ratio and the baseline cache is not touched."""
    from kernellab.sandbox import EvalJob, LocalExecutor

    store = Store(tmp_path / "k.db")
    problem = Problem(name="affine", source=AFFINE.read_text(), path=str(AFFINE))
    with LocalExecutor(workers_per_gpu=1) as ex:
        r = ex.submit(EvalJob(problem, GOOD, device="cuda", store=store, retime=True)).result()
    assert r["status"] == "correct", r["error_text"]
    t = r["details"]["timing"]
    assert set(t) >= {"candidate", "eager", "compile"}
    assert r["compile_ms"] == t["compile"]["median_ms"] and r["eager_ms"] == t["eager"]["median_ms"]
    assert r["speedup_compile"] == pytest.approx(r["compile_ms"] / r["median_ms"])
    assert t["compile"]["reps"] == t["candidate"]["reps"]  # interleaved: the same repetitions
    assert store._all("select * from baselines") == []
    band = _band(r)
    assert band["win_eager"] is not None and band["win_compile"] is not None
