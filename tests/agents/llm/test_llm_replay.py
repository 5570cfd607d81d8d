"""Record and replay: a campaign's recorded answers re-run it with the network disconnected."""

from __future__ import annotations

from dataclasses import replace

import pytest
from llm_recorded import FAKE_ANTHROPIC_KEY, SONNET, Recorded, disconnected, run_candidate

from kernellab.agents.llm import PreflightError, Proposal, ReplayMiss, make_agents
from kernellab.store import Store


def without_meta(answers):
    """The answers less their bookkeeping (call ids, cost, replayed flag)."""
    plan, code, fix, analysis = answers
    return plan, replace(code, meta={}), replace(fix, meta={}), analysis


def record_campaign(store, campaign, problem, tmp_path):
    """Plan, code, evaluate (fails), debug, analyze: every role once, against recordings."""
    rec = Recorded("anthropic_plan.json", "anthropic_debug_round.json", "anthropic_analyze.json")
    a = make_agents(f"anthropic:{SONNET}", store=store, campaign_id=campaign, api_key=FAKE_ANTHROPIC_KEY,
                    http_client=rec.client())
    plan = a.plan(problem, [], 2, {"eager_ms": 1.5})
    code = a.code(problem, plan[0], None)
    cid = store.add_candidate(campaign, problem.id, code.source, origin="llm", model=code.model,
                              action=code.action)
    fix = a.debug(problem, store.get_candidate(cid), run_candidate(problem, code.source, tmp_path))
    fid = store.add_candidate(campaign, problem.id, fix.source, parent_id=cid, origin="llm", model=SONNET)
    analysis = a.analyze(problem, store.get_candidate(fid), {"status": "correct", "median_ms": 0.231,
                                                            "speedup_eager": 1.12}, [])
    assert rec.done()
    return a, (plan, code, fix, analysis)


def replay_campaign(store, campaign, problem, tmp_path, **kw):
    a = make_agents(f"anthropic:{SONNET}", store=store, campaign_id=campaign, http_client=disconnected(), **kw)
    a.preflight()  # no key, no network: replay needs neither
    plan = a.plan(problem, [], 2, {"eager_ms": 1.5})
    code = a.code(problem, plan[0], None)
    cid = store.add_candidate(campaign, problem.id, code.source, origin="llm", model=code.model)
    # a fresh evaluation: its traceback names another temp file, so this prompt differs from the
    # recorded one and the answer is found by the call's replay key
    fix = a.debug(problem, store.get_candidate(cid), run_candidate(problem, code.source, tmp_path))
    fid = store.add_candidate(campaign, problem.id, fix.source, parent_id=cid, origin="llm", model=SONNET)
    analysis = a.analyze(problem, store.get_candidate(fid), {"status": "correct", "median_ms": 0.244,
                                                            "speedup_eager": 1.07}, [])
    return a, (plan, code, fix, analysis)


def test_replay_reproduces_the_answers_with_no_network(store, campaign, problem, tmp_path):
    recorded, answers = record_campaign(store, campaign, problem, tmp_path)
    b = store.create_campaign("replay", {}, "cpu", {})
    replayed, again = replay_campaign(store, b, problem, tmp_path, replay=campaign)
    assert without_meta(again) == without_meta(answers)
    assert again[1].meta["replayed"] and not answers[1].meta["replayed"]
    assert run_candidate(problem, again[2].source, tmp_path)["status"] == "correct"

    old, new = store.llm_calls(campaign_id=campaign), store.llm_calls(campaign_id=b)
    assert len(new) == len(old) == 4
    assert [r["response"]["replay_of"] for r in new] == [r["id"] for r in old]
    # plan and code prompts are identical (node refs are campaign-independent); debug and analyze
    # carry other error text and timings: found by replay key, not hash
    assert [n["request_hash"] == o["request_hash"] for n, o in zip(new, old, strict=True)] == [True, True, False, False]
    assert all(r["cost_usd"] == 0.0 for r in new)  # nothing spent ...
    assert replayed.spent_usd == pytest.approx(recorded.spent_usd)  # ... but the budget sees the same spend
    assert all(r["response"]["body"] == o["response"]["body"] for r, o in zip(new, old, strict=True))


def test_replay_from_another_database(store, campaign, problem, tmp_path):
    record_campaign(store, campaign, problem, tmp_path)
    fresh = Store(tmp_path / "other.db")
    fresh.add_problem(problem)
    b = fresh.create_campaign("replay", {}, "cpu", {})
    _, again = replay_campaign(fresh, b, problem, tmp_path, replay=store)
    assert again[0][1].idea.startswith("A single Triton GEMM")
    assert len(fresh.llm_calls(campaign_id=b)) == 4
    fresh.close()


def test_replay_budget_stops_at_the_same_point(store, campaign, problem, tmp_path):
    from kernellab.agents.llm import BudgetExceeded

    recorded, _ = record_campaign(store, campaign, problem, tmp_path)
    b = store.create_campaign("replay", {}, "cpu", {})
    first_cost = store.llm_calls(campaign_id=campaign)[0]["cost_usd"]
    a = make_agents(f"anthropic:{SONNET}", store=store, campaign_id=b, replay=campaign,
                    http_client=disconnected(), budget_usd=first_cost * 0.5)
    a.plan(problem, [], 2, {"eager_ms": 1.5})
    with pytest.raises(BudgetExceeded):
        a.code(problem, Proposal(None, "anything"), None)


def test_a_call_never_recorded_is_a_clear_miss(store, campaign, problem, tmp_path):
    record_campaign(store, campaign, problem, tmp_path)
    b = store.create_campaign("replay", {}, "cpu", {})
    a = make_agents(f"anthropic:{SONNET}", store=store, campaign_id=b, replay=campaign, http_client=disconnected())
    with pytest.raises(ReplayMiss, match="never asked"):
        a.code(problem, Proposal(None, "an idea nobody had"), None)


def test_replay_preflight(store, campaign):
    with pytest.raises(PreflightError, match="no campaign 'nope'"):
        make_agents(f"anthropic:{SONNET}", store=store, replay="nope")
    with pytest.raises(PreflightError, match="nothing to replay"):
        make_agents(f"anthropic:{SONNET}", store=store, replay=campaign).preflight()
