"""LLM campaigns end to end: the real LangGraph graph, sandbox, store and SDK clients; only the HTTP
transport is replaced, by recorded exchanges in the real Messages and Chat Completions formats.

Regenerate the recordings with ``.venv/bin/python tests/agents/test_llm_campaign.py``. They were
written by hand after the APIs' formats (not captured from a live server); token counts are made up
but priced exactly like real ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "llm"))  # the recorded-exchange helpers of tests/agents/llm

from llm_recorded import (  # noqa: E402
    FAKE_ANTHROPIC_KEY,
    FAKE_OPENAI_KEY,
    RECORDINGS,
    SONNET,
    Recorded,
    disconnected,
)

from kernellab.campaign import CampaignConfig, resume_campaign, run_campaign, start_campaign  # noqa: E402
from kernellab.store import Store  # noqa: E402

PROBLEM = HERE / "affine_problem.py"
LOCAL = "Qwen/Qwen2.5-Coder-32B-Instruct"
VLLM = "http://127.0.0.1:8000/v1"

# The model's first candidate imports a libdevice name that triton.language does not export: the
# module fails to load, a compile_error on the GPU and in the CPU interpreter alike. (A bare
# `tl.fma_rn(...)` inside the kernel is a CompilationError on the GPU but surfaces as an
# InterpreterError at the first call, a runtime_error, in the interpreter.)
FIXED = '''import torch
import triton
import triton.language as tl

CONFIG = {"BLOCK": 128}
SPACE = {"BLOCK": [64, 128, 256, 1024]}


@triton.jit
def _affine(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * 2.0 + 1.0, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        _affine[(triton.cdiv(n, CONFIG["BLOCK"]),)](x, out, n, BLOCK=CONFIG["BLOCK"])
        return out
'''
BUGGY = (FIXED.replace("import triton.language as tl\n", "import triton.language as tl\nfrom triton.language import fma_rn\n")
         .replace("x * 2.0 + 1.0, mask", "fma_rn(x, 2.0, 1.0), mask"))

PLAN = {"proposals": [{"parent": None, "idea": "One Triton kernel computing 2x+1 over the flat tensor, "
                       "BLOCK elements per program, masked tail.", "rationale": "A pointwise op: one read and "
                       "one write per element; a single fused pass is the memory-bound optimum.",
                       "expected_gain": 1.0}]}
CODE = {"source": BUGGY, "action": "flat Triton kernel, fma_rn for 2x+1", "language": "triton"}
DEBUG = {"diagnosis": "`fma_rn` is not exported by triton.language (ImportError when the module loads); "
         "2x+1 needs no intrinsic: `x * 2.0 + 1.0` compiles to an FMA anyway.",
         "source": FIXED, "action": "drop the fma_rn import, plain x * 2.0 + 1.0"}
ANALYSIS = {"bound": "memory", "pct_of_ceiling": None, "evidence": "8 bytes moved per element for 2 FLOPs "
            "(0.25 FLOP/byte): memory-bound; the timings are interpreted on the CPU, so no % of ceiling.",
            "next_ideas": ["BLOCK 1024 with num_warps 4 on the GPU", "vectorized 16-byte loads"]}

# (input, output, cache write, cache read) tokens per recorded Anthropic call, in call order
A_USAGE = {"planner": (1210, 260, 5400, 0), "coder": (1350, 420, 5100, 0),
           "debugger": (2100, 480, 0, 5100), "analyst": (1500, 200, 2300, 0)}
# Claude Sonnet 4.6, $ per million tokens: input, output, 5-minute cache write, cache read
SONNET_PRICE = (3.0, 15.0, 3.75, 0.30)
O_USAGE = {"planner": (3900, 150, 3072), "coder": (4100, 390, 3584), "analyst": (2700, 120, 2048)}  # prompt, completion, cached


def sonnet_cost(role: str) -> float:
    return sum(n * p for n, p in zip(A_USAGE[role], SONNET_PRICE, strict=True)) / 1e6


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def executor():
    from kernellab.sandbox import LocalExecutor

    ex = LocalExecutor(cpu_workers=1)  # one warm worker for every campaign of the module
    yield ex
    ex.shutdown()


@pytest.fixture(autouse=True)
def _no_real_keys(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def claude(client, store=None, campaign_id=None, **kw):
    from kernellab.agents.llm import make_agents

    return make_agents(f"anthropic:{SONNET}", store=store, campaign_id=campaign_id, api_key=FAKE_ANTHROPIC_KEY,
                       http_client=client, **kw)


def config(**kw) -> CampaignConfig:
    kw = {"problems": [str(PROBLEM)], "llm": f"anthropic:{SONNET}", "budget": 2, "width": 1, "trials": 2, **kw}
    return CampaignConfig(**kw)


def run_recorded(db: Path, executor, name: str = "llm", usd_budget: float = 5.0,
                 **kw) -> tuple[Store, str, Recorded]:
    """The recorded campaign: preflight, plan, code (fails to load), debug (fixed), analyze."""
    rec = Recorded("campaign_anthropic_start.json", "campaign_anthropic_rest.json")
    store = Store(db)
    cid = start_campaign(store, config(usd_budget=usd_budget, **kw), name=name, agents=claude(rec.client()))
    run_campaign(store, cid, executor=executor, agents=claude(rec.client(), store, cid, budget_usd=usd_budget))
    assert rec.done(), f"{len(rec.exchanges)} recorded exchanges left unused"
    return store, cid, rec


def file_bytes(db: Path) -> bytes:
    """The database and its WAL side files, as they lie on disk."""
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))


# -- 1. Claude: plan -> code (compile_error) -> debug -> analyze -------------------------------------
@pytest.mark.slow
def test_claude_campaign_through_the_graph(tmp_path, executor):
    db = tmp_path / "k.db"
    store, cid, rec = run_recorded(db, executor)

    assert store.get_campaign(cid)["status"] == "done"
    first, fixed = store.candidates(cid)
    assert (first["source"], fixed["source"]) == (BUGGY, FIXED)
    assert {c["origin"] for c in (first, fixed)} == {"llm"} and {c["model"] for c in (first, fixed)} == {SONNET}
    assert first["parent_id"] is None and fixed["parent_id"] == first["id"]
    assert fixed["meta"]["debug_of"] == first["id"] and fixed["meta"]["debug_round"] == 1

    (ev1,) = store.evaluations(candidate_id=first["id"], kind="full")
    (ev2,) = store.evaluations(candidate_id=fixed["id"], kind="full")
    assert (ev1["status"], ev1["error_class"]) == ("compile_error", "import")
    assert "cannot import name 'fma_rn'" in ev1["error_text"]
    assert ev2["status"] == "correct" and ev2["interpreted"] and ev2["max_abs_err"] == 0.0

    calls = store.llm_calls(campaign_id=cid)
    assert [c["role"] for c in calls] == ["planner", "coder", "debugger", "analyst"]
    for c in calls:
        tokens = (c["input_tokens"], c["output_tokens"], c["cache_write_tokens"], c["cache_read_tokens"])
        assert tokens == A_USAGE[c["role"]] and c["model"] == SONNET
        assert c["cost_usd"] == pytest.approx(sonnet_cost(c["role"]))
        assert c["prompt_version"].startswith(c["role"] + "-")
    assert [c["candidate_id"] for c in calls] == [None, None, first["id"], fixed["id"]]

    # what the model was shown: an empty tree, then the failing source with the loader's error
    bodies = [b for b in rec.bodies if b]
    assert "Search tree: empty" in bodies[0]["messages"][0]["content"]
    debug_prompt = bodies[2]["messages"][0]["content"]
    assert "from triton.language import fma_rn" in debug_prompt and "cannot import name 'fma_rn'" in debug_prompt
    assert bodies[2]["tool_choice"]["name"] == "submit_fix"

    kinds = [e["kind"] for e in store.events(cid)]
    # no "tune": on the CPU tuning resolves to 0 trials and the campaign has no tune step
    assert {"select", "plan", "code", "debug", "profile", "analyze", "stop"} <= set(kinds), kinds
    (dbg,) = store.events(cid, "debug")
    assert dbg["payload"]["candidate_id"] == first["id"] and dbg["payload"]["fixed_candidate_id"] == fixed["id"]
    assert dbg["payload"]["status"] == "compile_error" and "fma_rn" in dbg["payload"]["diagnosis"]
    (ana,) = store.events(cid, "analyze")
    assert ana["payload"]["candidate_id"] == fixed["id"] and ana["payload"]["bound"] == "memory"
    (stop,) = store.events(cid, "stop")
    assert stop["payload"]["reason"].startswith("budget: candidates")

    # the key went over the wire, and nowhere into the file
    # (this SDK sends it as x-api-key or as a bearer token)
    assert all(FAKE_ANTHROPIC_KEY in r.headers.get("x-api-key", "") + r.headers.get("authorization", "")
               for r in rec.requests)
    store.close()
    assert FAKE_ANTHROPIC_KEY.encode() not in file_bytes(db)
    assert b"TESTKEY" not in file_bytes(db)


# -- 2. replay with the network disconnected --------------------------------------------------------
@pytest.mark.slow
def test_replay_with_no_network_reaches_the_same_sources_and_statuses(tmp_path, executor):
    db = tmp_path / "k.db"
    store, first, _ = run_recorded(db, executor)
    # the public path of `kernellab run --replay`: the preflight finds the recorded answers, no key
    cid = start_campaign(store, config(usd_budget=5.0, replay="llm"), name="replayed")
    from kernellab.agents.llm import make_agents

    agents = make_agents(f"anthropic:{SONNET}", store=store, campaign_id=cid, replay="llm",
                         http_client=disconnected(), budget_usd=5.0)
    run_campaign(store, cid, executor=executor, agents=agents)

    def outcome(campaign):
        return [(c["source"], c["origin"], c["model"], c["action"],
                 store.evaluations(candidate_id=c["id"], kind="full")[0]["status"])
                for c in store.candidates(campaign)]

    assert outcome(cid) == outcome(first)
    assert [s for *_, s in outcome(cid)] == ["compile_error", "correct"]
    assert store.get_campaign(cid)["status"] == store.get_campaign(first)["status"] == "done"
    assert [e["payload"]["reason"] for e in store.events(cid, "stop")] == \
        [e["payload"]["reason"] for e in store.events(first, "stop")]
    old, new = store.llm_calls(campaign_id=first), store.llm_calls(campaign_id=cid)
    assert [r["response"]["replay_of"] for r in new] == [r["id"] for r in old]
    assert all(r["cost_usd"] == 0.0 for r in new)
    assert agents.spent_usd == pytest.approx(sum(r["cost_usd"] for r in old))  # the budget saw the same spend


from kernellab.agents.llm import BudgetExceeded  # noqa: E402


@pytest.mark.slow
def test_replay_stops_on_dollars_where_the_recorded_campaign_stopped(tmp_path, executor):
    usd = sum(sonnet_cost(r) for r in A_USAGE) * 0.999  # spent by the first round's four calls
    store, first, _ = run_recorded(tmp_path / "k.db", executor, usd_budget=usd, budget=3)
    (stop,) = store.events(first, "stop")
    assert store.get_campaign(first)["status"] == "done" and stop["payload"]["reason"].startswith("budget: llm_usd")
    cid = start_campaign(store, config(usd_budget=usd, budget=3, replay="llm"), name="replayed")
    from kernellab.agents.llm import make_agents

    run_campaign(store, cid, executor=executor, agents=make_agents(
        f"anthropic:{SONNET}", store=store, campaign_id=cid, replay="llm", http_client=disconnected(), budget_usd=usd))
    assert store.get_campaign(cid)["status"] == "done"
    assert [e["payload"]["reason"] for e in store.events(cid, "stop")] == [stop["payload"]["reason"]]


# -- 3. a dollar budget stops the campaign; a larger one resumes it ----------------------------------
@pytest.mark.slow
def test_budget_stop_then_resume_with_a_larger_budget(tmp_path, executor):
    db = tmp_path / "k.db"
    store = Store(db)
    rec = Recorded("campaign_anthropic_start.json")
    tiny = sonnet_cost("planner") / 2  # the plan call spends it all
    cid = start_campaign(store, config(usd_budget=tiny), name="budget", agents=claude(rec.client()))
    with pytest.raises(BudgetExceeded, match="resume it with a larger budget"):
        run_campaign(store, cid, executor=executor, agents=claude(rec.client(), store, cid, budget_usd=tiny))
    assert rec.done()
    assert store.get_campaign(cid)["status"] == "stopped"
    assert [c["role"] for c in store.llm_calls(campaign_id=cid)] == ["planner"]
    assert store.candidates(cid) == []  # stopped in the code step, before any candidate
    assert "BudgetExceeded" in store.events(cid, "session")[-1]["payload"]["stopped"]

    # the same budget: stops again at once, no request sent (the spending so far is the store's)
    with pytest.raises(BudgetExceeded):
        resume_campaign(store, cid, executor=executor, agents=claude(disconnected(), store, cid, budget_usd=tiny))
    assert len(store.llm_calls(campaign_id=cid)) == 1

    rest = Recorded("campaign_anthropic_rest.json")
    resume_campaign(store, cid, executor=executor, usd_budget=1.0,
                    agents=claude(rest.client(), store, cid, budget_usd=1.0))
    assert rest.done()
    camp = store.get_campaign(cid)
    assert camp["status"] == "done" and camp["config"]["usd_budget"] == 1.0
    # the plan was not asked again: the checkpoint resumed at the interrupted code step
    assert [c["role"] for c in store.llm_calls(campaign_id=cid)] == ["planner", "coder", "debugger", "analyst"]
    assert [c["source"] for c in store.candidates(cid)] == [BUGGY, FIXED]
    assert [store.evaluations(candidate_id=c["id"], kind="full")[0]["status"] for c in store.candidates(cid)] == \
        ["compile_error", "correct"]
    assert store.summary(cid)["llm"]["cost_usd"] == pytest.approx(sum(sonnet_cost(r) for r in A_USAGE))


# -- 4. an OpenAI-compatible server (vLLM) with a JSON schema response format ------------------------
@pytest.mark.slow
def test_openai_compatible_campaign(tmp_path, executor):
    from kernellab.agents.llm import make_agents

    db = tmp_path / "k.db"
    store = Store(db)
    rec = Recorded("campaign_openai.json")

    def agents(s=None, c=None):  # a vLLM started with --api-key: a key, but no dollars per token
        return make_agents(f"openai:{LOCAL}", base_url=VLLM, store=s, campaign_id=c, api_key=FAKE_OPENAI_KEY,
                           http_client=rec.client())

    cid = start_campaign(store, config(llm=f"openai:{LOCAL}", base_url=VLLM, budget=1), name="vllm",
                         agents=agents())
    run_campaign(store, cid, executor=executor, agents=agents(store, cid))
    assert rec.done()
    assert store.get_campaign(cid)["status"] == "done"
    (cand,) = store.candidates(cid)
    assert (cand["source"], cand["origin"], cand["model"]) == (FIXED, "llm", LOCAL)
    assert store.evaluations(candidate_id=cand["id"], kind="full")[0]["status"] == "correct"

    posts = [b for r, b in zip(rec.requests, rec.bodies, strict=True) if r.method == "POST"]
    assert [p["response_format"]["json_schema"]["name"] for p in posts] == \
        ["submit_plan", "submit_candidate", "submit_analysis"]
    assert all(p["response_format"]["type"] == "json_schema" and p["response_format"]["json_schema"]["strict"]
               for p in posts)
    assert all("max_tokens" in p and p["messages"][0]["role"] == "system" for p in posts)

    calls = store.llm_calls(campaign_id=cid)
    assert [c["role"] for c in calls] == ["planner", "coder", "analyst"]
    for c in calls:
        prompt, completion, cached = O_USAGE[c["role"]]
        assert (c["input_tokens"], c["output_tokens"], c["cache_read_tokens"]) == (prompt - cached, completion, cached)
        assert c["cost_usd"] == 0.0 and c["model"] == LOCAL
    assert {e["kind"] for e in store.events(cid)} >= {"plan", "code", "analyze", "stop"}
    assert all(r.headers["authorization"] == f"Bearer {FAKE_OPENAI_KEY}" for r in rec.requests)
    store.close()
    assert FAKE_OPENAI_KEY.encode() not in file_bytes(db)


# -- the recordings ----------------------------------------------------------------------------------
def _anthropic(n: int, tool: str, answer: dict, role: str) -> dict:
    inp, out, cw, cr = A_USAGE[role]
    body = {"id": f"msg_01Camp{n:04d}", "type": "message", "role": "assistant", "model": SONNET,
            "content": [{"type": "tool_use", "id": f"toolu_01Camp{n:04d}", "name": tool, "input": answer}],
            "stop_reason": "tool_use", "stop_sequence": None,
            "usage": {"input_tokens": inp, "cache_creation_input_tokens": cw, "cache_read_input_tokens": cr,
                      "cache_creation": {"ephemeral_5m_input_tokens": cw, "ephemeral_1h_input_tokens": 0},
                      "output_tokens": out, "service_tier": "standard"}}
    return {"request": {"method": "POST", "path": "/v1/messages"},
            "response": {"status": 200, "headers": {"content-type": "application/json",
                                                    "request-id": f"req_011CCamp{n:04d}"}, "body": body}}


def _chat(n: int, answer: dict, role: str) -> dict:
    prompt, completion, cached = O_USAGE[role]
    body = {"id": f"chatcmpl-camp{n}", "object": "chat.completion", "created": 1764400000 + n, "model": LOCAL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": json.dumps(answer),
                                                 "refusal": None, "tool_calls": []},
                         "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": cached}},
            "system_fingerprint": None}
    return {"request": {"method": "POST", "path": "/v1/chat/completions"},
            "response": {"status": 200, "headers": {"content-type": "application/json"}, "body": body}}


def _get(path: str, body: dict) -> dict:
    return {"request": {"method": "GET", "path": path},
            "response": {"status": 200, "headers": {"content-type": "application/json"}, "body": body}}


def write_recordings() -> None:
    sonnet = {"type": "model", "id": SONNET, "display_name": "Claude Sonnet 4.6", "created_at": "2026-02-17T00:00:00Z"}
    served = {"object": "list", "data": [{"id": LOCAL, "object": "model", "created": 1764300000, "owned_by": "vllm",
                                          "root": LOCAL, "parent": None, "max_model_len": 32768}]}
    recs = {
        "campaign_anthropic_start.json": [_get(f"/v1/models/{SONNET}", sonnet),
                                          _anthropic(1, "submit_plan", PLAN, "planner")],
        "campaign_anthropic_rest.json": [_anthropic(2, "submit_candidate", CODE, "coder"),
                                         _anthropic(3, "submit_fix", DEBUG, "debugger"),
                                         _anthropic(4, "submit_analysis", ANALYSIS, "analyst")],
        "campaign_openai.json": [_get("/v1/models", served), _chat(1, PLAN, "planner"),
                                 _chat(2, {**CODE, "source": FIXED, "action": "flat Triton kernel for 2x+1"}, "coder"),
                                 _chat(3, ANALYSIS, "analyst")],
    }
    for name, exchanges in recs.items():
        (RECORDINGS / name).write_text(json.dumps(exchanges, indent=1) + "\n")
        print("wrote", RECORDINGS / name)


if __name__ == "__main__":
    write_recordings()
