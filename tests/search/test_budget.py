"""Budgets and stop rules on synthetic trees in a real in-memory store."""

from __future__ import annotations

import pytest
from search_synth import Synth

from kernellab.search import Budget, StopRules, Tree, Usage, check, pct_of_ceiling, stop_reason


def test_usage_from_store(synth) -> None:
    store = synth.store
    store.add_llm_call({"campaign_id": synth.cid, "role": "code", "cost_usd": 0.25})
    store.add_llm_call({"campaign_id": synth.cid, "role": "plan", "cost_usd": 0.5})
    synth.add("g", "a1", 2.1, details={"gpu_s": 1.5})
    synth.add("h", "a1", 2.2, details={"gpu_s": 2.0})
    u = Usage.from_store(store, synth.cid, wall_s=12.0)
    assert (u.candidates, u.wall_s, u.gpu_s, u.llm_usd) == (10, 12.0, 3.5, 0.75)


@pytest.mark.parametrize("field,limit,used,stops", [
    ("candidates", 10, 10, True), ("candidates", 11, 10, False),
    ("wall_s", 60.0, 61.0, True), ("gpu_s", 5.0, 4.9, False), ("llm_usd", 1.0, 1.0, True)])
def test_budget_whichever_ends_first(field, limit, used, stops) -> None:
    decision = Budget(**{field: limit}).check(Usage(**{field: used}))
    assert (decision is not None) == stops
    if stops:
        assert decision.rule == f"budget:{field}" and decision.details == {"used": used, "limit": limit}


def test_budget_rejects_nonpositive_limits() -> None:
    with pytest.raises(ValueError, match="candidates must be > 0"):
        Budget(candidates=0)


def test_target_counts_real_speedups_only(store) -> None:
    t = Synth(store)
    t.add("r", speedup=3.0, interpreted=True)  # surrogate 3.0: must not claim the target
    assert StopRules(target=2.0, plateau_window=None).check(Tree(store, t.cid, t.pid)) is None
    t.add("g", "r", 2.5)
    d = StopRules(target=2.0, plateau_window=None).check(Tree(store, t.cid, t.pid))
    assert d.rule == "target" and d.details["candidate_id"] == t.ids["g"]


@pytest.mark.parametrize("gains,window,stops", [
    ([1.0, 1.5, 1.505, 1.51, 1.509], 3, True),   # +0.67% over the last 3: below 1%
    ([1.0, 1.5, 1.505, 1.52, 1.509], 3, False),  # +1.3%: a real gain
    ([1.0, 1.5, 1.505, 1.51, 1.509], 4, False),  # the window reaches back past the jump
    ([1.0, 1.0, 1.0], 3, False),                 # not enough expansions yet
])
def test_plateau(store, gains, window, stops) -> None:
    t = Synth(store)
    parent = None
    for i, g in enumerate(gains):
        t.add(f"n{i}", parent, g)
        parent = f"n{i}"
    d = StopRules(plateau_window=window).check(Tree(store, t.cid, t.pid))
    assert (d is not None) == stops
    if stops:
        assert d.rule == "plateau" and d.details["best_before"] == 1.5 and d.details["best_now"] == 1.51


def test_plateau_counts_failed_expansions(store) -> None:
    t = Synth(store)
    t.add("r", speedup=1.2)
    for i in range(3):
        t.add(f"f{i}", "r", status="runtime_error")
    assert StopRules(plateau_window=3).check(Tree(store, t.cid, t.pid)).rule == "plateau"


def test_roofline_reads_the_analyst_and_the_measured_ceilings(synth) -> None:
    rules = StopRules(plateau_window=None)
    tree = Tree(synth.store, synth.cid, synth.pid)
    assert rules.check(tree) is None
    synth.store.add_event(synth.cid, "analyze", {"candidate_id": synth.ids["a"], "bound": "memory",
                                                 "pct_of_ceiling": 95.0})  # not the best node
    assert rules.check(tree) is None
    pct = pct_of_ceiling("memory", 3.9e12)
    assert pct == pytest.approx(92.4, abs=0.1)
    synth.store.add_event(synth.cid, "analyze", {"candidate_id": synth.ids["a1"], "bound": "memory",
                                                 "pct_of_ceiling": pct})
    d = rules.check(tree)
    assert d.rule == "roofline" and d.details["bound"] == "memory"
    assert StopRules(plateau_window=None, roofline=0.95).check(tree) is None
    with pytest.raises(ValueError, match="no measured ceiling"):
        pct_of_ceiling("compute", 1e12, dtype="int8")


def test_roofline_needs_the_ceiling_device(store) -> None:
    t = Synth(store)
    t.add("r", speedup=2.0, device="NVIDIA A100")
    store.add_event(t.cid, "analyze", {"candidate_id": t.ids["r"], "bound": "memory", "pct_of_ceiling": 99.0})
    assert StopRules(plateau_window=None).check(Tree(store, t.cid, t.pid)) is None


def test_roofline_reads_the_problems_floor_without_a_profile(synth, store) -> None:
    # the best, a1, runs 1.0 ms (eager 2.0 ms at 2.0x); no analyst has spoken
    tree = Tree(synth.store, synth.cid, synth.pid)
    assert StopRules(plateau_window=None, floor_ms=0.89).check(tree) is None
    d = StopRules(plateau_window=None, floor_ms=0.9).check(tree)
    assert d.rule == "roofline" and d.details["candidate_id"] == synth.ids["a1"]
    assert d.details["pct_of_floor"] == pytest.approx(90.0) and "90% of the problem's floor, 0.9 ms" in d.reason
    assert StopRules(plateau_window=None, roofline=None, floor_ms=5.0).check(tree) is None
    assert stop_reason(tree, None, plateau=None, floor_ms=0.95).startswith("roofline:")
    # the floor is the H200's: a time measured elsewhere, or interpreted, is not divided by it
    other = Synth(store, "elsewhere")
    other.add("r", speedup=2.0, device="NVIDIA A100")
    assert StopRules(plateau_window=None, floor_ms=5.0).check(Tree(store, other.cid, other.pid)) is None
    cpu = Synth(store, "interpreted")
    cpu.add("r", speedup=2.0, interpreted=True, device="cpu")
    assert StopRules(plateau_window=None, floor_ms=5.0).check(Tree(store, cpu.cid, cpu.pid)) is None


def test_check_budget_first(synth) -> None:
    tree = Tree(synth.store, synth.cid, synth.pid)
    rules = StopRules(target=1.5)
    assert check(tree, Budget(candidates=8), rules).rule == "budget:candidates"
    assert check(tree, Budget(candidates=9), rules).rule == "target"
    assert check(tree, Budget(candidates=9), StopRules(plateau_window=None, roofline=None)) is None
    d = check(tree, Budget(wall_s=10.0), rules, usage=Usage(wall_s=10.0))
    assert d.rule == "budget:wall_s" and "wall_s spent" in d.reason


def test_stop_reason_for_the_campaign_runner(synth) -> None:
    tree = Tree(synth.store, synth.cid, synth.pid)
    assert stop_reason(tree, Budget(candidates=20), elapsed_s=1.0, target=None, plateau=None) is None
    assert stop_reason(tree, Budget(candidates=20), target=1.9, plateau=None).startswith("target:")
    assert stop_reason(tree, Budget(candidates=20, wall_s=5.0), elapsed_s=6.0, plateau=None).startswith("budget: wall_s")
    # plateau counts expansions: after a1 (node 5 of 8) nothing beat 2.0
    assert stop_reason(tree, None, plateau=3).startswith("plateau:")
    assert stop_reason(tree, None, plateau=4) is None


def test_stop_reason_honours_rounds(synth) -> None:
    # `rounds` was accepted and ignored: a round limit never stopped a problem
    tree = Tree(synth.store, synth.cid, synth.pid)
    budget = Budget(candidates=20, rounds=3)
    assert stop_reason(tree, budget, rounds=2, plateau=None) is None
    assert stop_reason(tree, budget, rounds=3, plateau=None) == "budget: rounds spent, 3 of 3"
    assert stop_reason(tree, Budget(candidates=20), rounds=1000, plateau=None) is None  # no round limit


def test_one_budget_for_the_campaign_and_the_graph(synth) -> None:
    cfg = {"budget": 10, "time_budget_s": 60.0, "gpu_budget_s": None, "usd_budget": 5.0}
    budget = Budget.of_campaign(cfg)
    # dollars end the campaign's problems between rounds once spent (the LLM backend also refuses a
    # single call that would overspend: BudgetExceeded, resumable)
    assert budget == Budget(candidates=10, wall_s=60.0, llm_usd=5.0)
    used = Usage.from_store(synth.store, synth.cid, problem_id=synth.pid)
    assert used.candidates == 8 and budget.candidates_left(used) == 2 == budget.candidates_left(8)
    assert budget.candidates_left(12) == 0
    assert Budget(wall_s=1.0).candidates_left(10**6) > 10**6  # no candidate limit
    assert budget.check(Usage(candidates=8, llm_usd=1.0)) is None
    assert budget.check(Usage(candidates=8, llm_usd=5.0)) is not None
