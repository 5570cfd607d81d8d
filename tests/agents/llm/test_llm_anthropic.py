"""The Anthropic backend through the real ``anthropic`` SDK client, against recorded exchanges."""

from __future__ import annotations

import json

import pytest
from llm_recorded import FAKE_ANTHROPIC_KEY, RECORDINGS, SONNET, Recorded, disconnected, run_candidate

from kernellab.agents.llm import (
    SCHEMAS,
    BudgetExceeded,
    LLMAgents,
    LLMUnavailable,
    PreflightError,
    Proposal,
    make_agents,
    system_prompt,
)


def agents(store, campaign, rec, **kw) -> LLMAgents:
    kw.setdefault("api_key", FAKE_ANTHROPIC_KEY)
    return make_agents(f"anthropic:{kw.pop('model', SONNET)}", store=store, campaign_id=campaign,
                       http_client=rec.client() if rec is not None else disconnected(), **kw)


def all_rows_text(store) -> str:
    return json.dumps(store.llm_calls(), default=str)


def test_plan_uses_forced_tool_and_cache_control_and_accounts_tokens(store, campaign, problem):
    rec = Recorded("anthropic_plan.json")
    a = agents(store, campaign, rec)
    proposals = a.plan(problem, [], 2, {"ops": [{"name": "aten::addmm", "ms": 1.2, "share": 0.8}],
                                        "eager_ms": 1.5, "compile_ms": 1.1})
    assert len(proposals) == 2 and all(isinstance(p, Proposal) and p.parent_id is None for p in proposals)
    assert proposals[1].expected_gain == 1.3 and "GEMM" in proposals[1].idea

    (req,) = rec.requests
    # the key is used on the wire (this SDK sends it as a bearer token) ...
    assert FAKE_ANTHROPIC_KEY in (req.headers.get("authorization", "") + req.headers.get("x-api-key", ""))
    body = rec.bodies[0]
    assert body["tool_choice"] == {"type": "tool", "name": "submit_plan", "disable_parallel_tool_use": True}
    assert body["tools"][0]["input_schema"] == SCHEMAS["planner"].schema
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert body["system"][0]["text"] == system_prompt("planner").text
    assert "temperature" not in body  # sampling parameters are rejected by Sonnet 5 and later

    (row,) = store.llm_calls(campaign_id=campaign)
    assert (row["input_tokens"], row["output_tokens"], row["cache_write_tokens"], row["cache_read_tokens"]) == (
        812, 402, 3921, 0)
    # Sonnet 4.6: $3 in, $15 out, $3.75 5-minute cache writes (per million tokens)
    assert row["cost_usd"] == pytest.approx((812 * 3 + 402 * 15 + 3921 * 3.75) / 1e6)
    assert a.spent_usd == pytest.approx(row["cost_usd"])
    assert row["role"] == "planner" and row["model"] == SONNET
    assert row["prompt_version"] == system_prompt("planner").version
    assert row["request"]["request"]["tool_choice"]["name"] == "submit_plan"
    assert row["response"]["body"]["content"][0]["type"] == "tool_use"
    assert FAKE_ANTHROPIC_KEY not in all_rows_text(store)  # ... and never stored


def test_cache_read_priced_at_the_cache_hit_rate(store, campaign, problem):
    rec = Recorded("anthropic_plan_cached.json")
    agents(store, campaign, rec).plan(problem, [], 2, {})
    (row,) = store.llm_calls(campaign_id=campaign)
    assert row["cache_read_tokens"] == 3921 and row["cache_write_tokens"] == 0
    assert row["cost_usd"] == pytest.approx((790 * 3 + 388 * 15 + 3921 * 0.30) / 1e6)


@pytest.mark.parametrize("recording, status", [("anthropic_429_then_ok.json", 429),
                                               ("anthropic_529_then_ok.json", 529)])
def test_rate_limit_and_overload_are_retried_by_the_sdk(store, campaign, problem, recording, status):
    rec = Recorded(recording)
    proposals = agents(store, campaign, rec).plan(problem, [], 2, {})
    assert len(proposals) == 2 and rec.done()
    assert len(rec.requests) == 2 and rec.bodies[0] == rec.bodies[1]
    (row,) = store.llm_calls(campaign_id=campaign)  # one logical call, one row
    assert row["response"]["transport_retries"] == 1


def test_persistent_overload_gives_a_clear_resumable_error(store, campaign, problem):
    rec = Recorded("anthropic_529_always.json")
    with pytest.raises(LLMUnavailable, match="529"):
        agents(store, campaign, rec, max_retries=1).plan(problem, [], 2, {})
    (row,) = store.llm_calls(campaign_id=campaign)  # the failed attempt is on record
    assert row["response"]["body"] is None and "529" in row["response"]["error"]


def test_code_without_modelnew_is_retried_with_the_reason(store, campaign, problem, tmp_path):
    rec = Recorded("anthropic_malformed_then_ok.json")
    code = agents(store, campaign, rec).code(problem, Proposal(None, "fuse the epilogue"), None)
    assert "class ModelNew(" in code.source and code.origin == "llm" and code.model == SONNET
    assert code.meta["attempts"] == 2 and len(code.meta["llm_calls"]) == 2

    retry = rec.bodies[1]["messages"]
    assert [m["role"] for m in retry] == ["user", "assistant", "user"]
    assert retry[1]["content"][0]["id"] == "toolu_01CodeE5"
    (result,) = retry[2]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_01CodeE5" and result["is_error"]
    assert "class ModelNew" in result["content"]

    first, second = store.llm_calls(campaign_id=campaign)
    assert "ModelNew" in first["response"]["rejected"][0] and "rejected" not in second["response"]
    assert run_candidate(problem, code.source, tmp_path)["status"] == "correct"


def test_failing_model_code_goes_through_a_debugger_round(store, campaign, problem, tmp_path):
    rec = Recorded("anthropic_debug_round.json")
    a = agents(store, campaign, rec)
    code = a.code(problem, Proposal(None, "fuse bias+gelu+scale into one Triton epilogue"), None)
    first = run_candidate(problem, code.source, tmp_path)
    assert first["status"] == "runtime_error" and "erff" in first["error_text"]

    cid = store.add_candidate(campaign, problem.id, code.source, origin="llm", model=code.model,
                              action=code.action, language=code.language)
    fix = a.debug(problem, store.get_candidate(cid), first)
    sent = rec.bodies[1]["messages"][0]["content"]
    assert "erff" in sent and "runtime_error" in sent and code.source.strip() in sent
    assert "tl.math.erf" in fix.diagnosis and fix.source is not None
    assert run_candidate(problem, fix.source, tmp_path)["status"] == "correct"
    assert store.llm_calls(campaign_id=campaign)[1]["candidate_id"] == cid


def test_forced_tool_choice_rejected_falls_back_to_auto(store, campaign, problem):
    rec = Recorded("anthropic_forced_tool_rejected.json")
    a = agents(store, campaign, rec, model="claude-opus-5")
    assert len(a.plan(problem, [], 2, {})) == 2
    assert rec.bodies[0]["tool_choice"]["type"] == "tool"
    assert rec.bodies[1]["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    # the row carries the request actually answered (auto), so a replay rebuilds the same one
    rows = store.llm_calls(campaign_id=campaign)
    assert rows[-1]["request"]["request"]["tool_choice"]["type"] == "auto"


def test_models_known_to_reject_forced_tools_ask_with_auto(store, campaign):
    a = agents(store, campaign, None, model="claude-sonnet-5-5")
    req = a.backend.build("planner", "sys", [{"role": "user", "content": "x"}], SCHEMAS["planner"])
    assert req["tool_choice"]["type"] == "auto"


def test_dollar_budget_stops_before_the_next_call_and_survives_resume(store, campaign, problem):
    rec = Recorded("anthropic_plan.json")
    a = agents(store, campaign, rec, budget_usd=0.01)
    a.plan(problem, [], 2, {})  # ~$0.023: over budget after this call
    with pytest.raises(BudgetExceeded, match=r"\$0\.01"):
        a.plan(problem, [], 2, {})
    assert len(rec.requests) == 1
    resumed = agents(store, campaign, None, budget_usd=0.01)  # a resumed campaign keeps its spending
    assert resumed.spent_usd == pytest.approx(a.spent_usd)
    with pytest.raises(BudgetExceeded):
        resumed.plan(problem, [], 2, {})


def test_key_never_stored_even_when_a_prompt_contains_it(store, campaign, problem):
    from dataclasses import replace

    leaky = replace(problem, source=problem.source + f"\n# token = '{FAKE_ANTHROPIC_KEY}'\n")
    rec = Recorded("anthropic_plan.json")
    agents(store, campaign, rec).plan(leaky, [], 2, {})
    assert FAKE_ANTHROPIC_KEY not in rec.requests[0].content.decode()  # scrubbed before sending, too
    assert "[REDACTED]" in rec.bodies[0]["messages"][0]["content"]
    assert FAKE_ANTHROPIC_KEY not in all_rows_text(store)


# -- preflight -------------------------------------------------------------------------------------
def test_preflight_ok(store, campaign):
    rec = Recorded("anthropic_preflight_ok.json")
    agents(store, campaign, rec).preflight()
    assert rec.done() and not store.llm_calls()


def test_preflight_unknown_model_is_one_clear_line(store, campaign):
    rec = Recorded("anthropic_preflight_404.json")
    with pytest.raises(PreflightError) as e:
        agents(store, campaign, rec, model="claude-sonnet-9-9").preflight()
    assert "unknown Anthropic model 'claude-sonnet-9-9'" in str(e.value) and "\n" not in str(e.value)


def test_preflight_rejected_key(store, campaign):
    with pytest.raises(PreflightError, match="ANTHROPIC_API_KEY was rejected"):
        agents(store, campaign, Recorded("anthropic_preflight_401.json")).preflight()


def test_preflight_missing_key_needs_no_network(store, campaign):
    with pytest.raises(PreflightError, match="ANTHROPIC_API_KEY is not set"):
        agents(store, campaign, None, api_key=None).preflight()


def test_preflight_unreachable(store, campaign):
    with pytest.raises(PreflightError, match="cannot reach the Anthropic API"):
        agents(store, campaign, None, max_retries=0).preflight()


def test_preflight_refuses_a_budget_without_a_price(store, campaign):
    with pytest.raises(PreflightError, match="no price known"):
        agents(store, campaign, None, model="claude-unknown-1", budget_usd=5.0).preflight()


def test_plan_expands_a_selected_node_named_by_its_source_hash(store, campaign, problem):
    fixed = json.loads((RECORDINGS / "anthropic_debug_round.json").read_text())[1]["response"]["body"]
    fixed_source = fixed["content"][0]["input"]["source"]
    root = store.add_candidate(campaign, problem.id, "# root\n", origin="seed")
    node = store.add_candidate(campaign, problem.id, fixed_source, parent_id=root, origin="llm")
    tree = [dict(store.get_candidate(root), best={"status": "correct", "speedup_eager": 1.0}, analysis=None),
            dict(store.get_candidate(node), best={"status": "correct", "speedup_eager": 1.12},
                 analysis={"bound": "memory", "pct_of_ceiling": 71.5, "next_ideas": ["fuse the GEMM"]},
                 selected=True)]
    rec = Recorded("anthropic_plan_expand.json")
    (p,) = agents(store, campaign, rec).plan(problem, tree, 1, {})
    assert p.parent_id == node  # the ref the model used maps back to this campaign's candidate id
    ref = store.get_candidate(node)["source_hash"][:10]
    prompt = rec.bodies[0]["messages"][0]["content"]
    assert f"Selected for expansion: {ref}" in prompt and node not in prompt  # ids are campaign-specific
    assert "memory-bound at 71.5%" in prompt
    (result,) = rec.bodies[1]["messages"][2]["content"]
    assert "'0123456789' is not one of the nodes selected" in result["content"]


def test_parallel_calls_account_every_dollar(store, campaign, problem):
    """The graph expands proposals in parallel branches: one backend serves them concurrently."""
    from concurrent.futures import ThreadPoolExecutor

    rec = Recorded(*["anthropic_plan.json"] * 4)
    a = agents(store, campaign, rec)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: a.plan(problem, [], 2, {}), range(4)))
    assert all(len(r) == 2 for r in results) and rec.done()
    rows = store.llm_calls(campaign_id=campaign)
    assert len(rows) == 4 and len(a.history) == 4
    assert a.spent_usd == pytest.approx(sum(r["cost_usd"] for r in rows))
