"""The OpenAI-compatible backend (vLLM, llama.cpp, Ollama, OpenAI) through the real ``openai`` SDK
client, against recorded Chat Completions exchanges."""

from __future__ import annotations

import json

import pytest
from llm_recorded import FAKE_OPENAI_KEY, Recorded, disconnected

from kernellab.agents.llm import SCHEMAS, PreflightError, make_agents, system_prompt

LOCAL = "Qwen/Qwen2.5-Coder-32B-Instruct"
VLLM = "http://localhost:8000/v1"


def agents(store, campaign, rec, base_url=VLLM, model=LOCAL, **kw):
    return make_agents(f"openai:{model}", base_url=base_url, store=store, campaign_id=campaign,
                       http_client=rec.client() if rec is not None else disconnected(), **kw)


def test_plan_on_a_local_server_uses_a_strict_json_schema(store, campaign, problem):
    rec = Recorded("openai_plan.json")
    proposals = agents(store, campaign, rec).plan(problem, [], 2, {"eager_ms": 1.5})
    assert [p.expected_gain for p in proposals] == [1.15, 1.3]

    (req,) = rec.requests
    assert str(req.url) == f"{VLLM}/chat/completions"
    assert req.headers["authorization"] == "Bearer kernellab-local"  # placeholder: local servers need no key
    body = rec.bodies[0]
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["name"] == "submit_plan" and fmt["json_schema"]["schema"] == SCHEMAS["planner"].schema
    assert body["messages"][0] == {"role": "system", "content": system_prompt("planner").text}
    assert body["max_tokens"] == 4096 and "max_completion_tokens" not in body

    (row,) = store.llm_calls(campaign_id=campaign)
    # prompt_tokens includes the cached part; input_tokens is the uncached part, as for Anthropic
    assert (row["input_tokens"], row["cache_read_tokens"], row["output_tokens"]) == (4210 - 3584, 3584, 380)
    assert row["cost_usd"] == 0.0 and row["model"] == LOCAL


def test_invalid_json_is_retried_with_the_parse_error(store, campaign, problem):
    rec = Recorded("openai_bad_json_then_ok.json")
    cand = {"id": "c1", "source": "class ModelNew: pass\n", "language": "triton"}
    analysis = agents(store, campaign, rec).analyze(problem, cand, {"status": "correct", "median_ms": 0.2}, [])
    assert analysis.bound == "memory" and analysis.pct_of_ceiling == 71.5 and len(analysis.next_ideas) == 2
    retry = rec.bodies[1]["messages"]
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"]
    assert "not valid JSON" in retry[3]["content"] and retry[2]["content"].startswith("```json")
    first, second = store.llm_calls(campaign_id=campaign)
    assert "not valid JSON" in first["response"]["rejected"][0]
    assert first["candidate_id"] == "c1" and second["cache_read_tokens"] == 2560


def test_rate_limit_retried(store, campaign, problem):
    rec = Recorded("openai_429_then_ok.json")
    assert len(agents(store, campaign, rec).plan(problem, [], 2, {})) == 2
    assert len(rec.requests) == 2 and rec.done()


def test_hosted_api_uses_the_key_and_never_stores_it(store, campaign, problem, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_OPENAI_KEY)
    rec = Recorded("openai_plan.json")
    agents(store, campaign, rec, base_url=None).plan(problem, [], 2, {})
    assert rec.requests[0].url.host == "api.openai.com"
    assert rec.requests[0].headers["authorization"] == f"Bearer {FAKE_OPENAI_KEY}"
    assert "max_completion_tokens" in rec.bodies[0]
    assert FAKE_OPENAI_KEY not in json.dumps(store.llm_calls(), default=str)


def test_preflight_ok_and_unknown_model(store, campaign):
    agents(store, campaign, Recorded("openai_preflight_ok.json")).preflight()
    with pytest.raises(PreflightError) as e:
        agents(store, campaign, Recorded("openai_preflight_ok.json"), model="llama-3-70b").preflight()
    msg = str(e.value)
    assert "unknown model 'llama-3-70b' at http://localhost:8000/v1" in msg and LOCAL in msg


def test_preflight_unreachable_server(store, campaign):
    with pytest.raises(PreflightError, match="cannot reach the OpenAI-compatible server at http://localhost:8000"):
        agents(store, campaign, None, max_retries=0).preflight()


def test_preflight_hosted_without_key(store, campaign):
    with pytest.raises(PreflightError, match="OPENAI_API_KEY is not set"):
        agents(store, campaign, None, base_url=None).preflight()


def test_credentials_in_base_url_never_echoed(store, campaign):
    with pytest.raises(PreflightError) as e:
        agents(store, campaign, None, base_url="http://user:s3cretpass@gpu-box:8000/v1", max_retries=0).preflight()
    assert "s3cretpass" not in str(e.value) and "gpu-box:8000" in str(e.value)


@pytest.mark.parametrize("spec", ["gpt-4o", "openai:", "anthropic", "vertex:claude"])
def test_bad_spec(spec):
    with pytest.raises(PreflightError, match="--llm must be builtin"):
        make_agents(spec)
