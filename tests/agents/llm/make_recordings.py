"""Regenerate with `.venv/bin/python tests/agents/llm/make_recordings.py`.
Writes tests/agents/llm/recordings/*.json: HTTP exchanges in the real Messages API and Chat
Completions API formats (written by hand after the SDK's types; not captured from a live server)."""
import json
import pathlib

OUT = pathlib.Path(__file__).resolve().parent / "recordings"
SONNET = "claude-sonnet-4-6"
LOCAL = "Qwen/Qwen2.5-Coder-32B-Instruct"

BUGGY = '''import torch
import triton
import triton.language as tl

CONFIG = {"BLOCK": 1024, "num_warps": 4}
SPACE = {"BLOCK": [256, 512, 1024, 2048], "num_warps": [2, 4, 8]}


@triton.jit
def _bias_gelu_scale(y_ptr, b_ptr, out_ptr, n, n_cols, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs % n_cols, mask=mask, other=0.0)
    z = y + b
    g = 0.5 * z * (1.0 + tl.erff(z * 0.7071067811865476))
    tl.store(out_ptr + offs, g * scale, mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        y = torch.matmul(x, self.linear.weight.t()).contiguous()
        out = torch.empty_like(y)
        n = y.numel()
        block = CONFIG["BLOCK"]
        _bias_gelu_scale[(triton.cdiv(n, block),)](y, self.linear.bias, out, n, y.shape[1], self.scale,
                                                   BLOCK=block, num_warps=CONFIG["num_warps"])
        return out
'''
FIXED = BUGGY.replace("tl.erff(", "tl.math.erf(")
NO_MODELNEW = BUGGY.replace("class ModelNew(", "class FusedEpilogue(")


def msg(mid, tool_id, name, inp, usage, model=SONNET, thinking=False):
    content = []
    if thinking:
        content.append({"type": "text", "text": "I'll submit the plan."})
    content.append({"type": "tool_use", "id": tool_id, "name": name, "input": inp})
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": "tool_use", "stop_sequence": None, "usage": usage}


def usage(inp, out, cw=0, cr=0):
    return {"input_tokens": inp, "cache_creation_input_tokens": cw, "cache_read_input_tokens": cr,
            "cache_creation": {"ephemeral_5m_input_tokens": cw, "ephemeral_1h_input_tokens": 0},
            "output_tokens": out, "service_tier": "standard"}


def ok(body, path="/v1/messages", headers=None):
    h = {"content-type": "application/json", "request-id": "req_011CVabc" + body.get("id", "x")[-6:]}
    h.update(headers or {})
    return {"request": {"method": "POST", "path": path}, "response": {"status": 200, "headers": h, "body": body}}


def err(status, etype, message, path="/v1/messages", method="POST", headers=None):
    h = {"content-type": "application/json", "x-should-retry": "true" if status in (429, 529) else "false"}
    h.update(headers or {})
    return {"request": {"method": method, "path": path},
            "response": {"status": status, "headers": h,
                         "body": {"type": "error", "error": {"type": etype, "message": message},
                                  "request_id": f"req_011CVerr{status}"}}}


PLAN = {"proposals": [
    {"parent": None, "idea": "Keep the GEMM in cuBLAS and fuse bias, exact GELU and scale into one Triton "
     "epilogue kernel over the output (one read, one write).", "rationale": "The epilogue ops are three "
     "separate passes over the output in eager mode; fusing removes two round trips through HBM.",
     "expected_gain": 1.15},
    {"parent": None, "idea": "A single Triton GEMM with the bias+GELU+scale epilogue applied to the fp32 "
     "accumulator (BLOCK 128x128x64, GROUP_M 8).", "rationale": "Removes the epilogue traffic entirely "
     "and the extra launch.", "expected_gain": 1.3}]}
CODE = lambda src: {"source": src, "action": "fuse bias+gelu+scale into one Triton epilogue", "language": "triton"}
DEBUG = {"diagnosis": "`tl.erff` does not exist in triton.language, so the kernel fails when it is "
         "compiled (AttributeError in the interpreter). The exact GELU needs `tl.math.erf`.",
         "source": FIXED, "action": "use tl.math.erf for the exact GELU"}
ANALYSIS = {"bound": "memory", "pct_of_ceiling": 71.5, "evidence": "The epilogue kernel moves 2 x 33.5 MB "
            "in 0.022 ms = 3.0 TB/s, 71% of the 4.22 TB/s copy ceiling; the GEMM itself is cuBLAS.",
            "next_ideas": ["fuse the epilogue into a Triton GEMM to remove its traffic",
                           "persistent grid over output tiles"]}

models_ok = {"request": {"method": "GET", "path": f"/v1/models/{SONNET}"},
             "response": {"status": 200, "headers": {"content-type": "application/json"},
                          "body": {"type": "model", "id": SONNET, "display_name": "Claude Sonnet 4.6",
                                   "created_at": "2026-02-17T00:00:00Z", "lifecycle": "active",
                                   "max_input_tokens": 200000, "max_tokens": 64000}}}

rec = {
    "anthropic_plan.json": [ok(msg("msg_01PlanA1", "toolu_01PlanA1", "submit_plan", PLAN, usage(812, 402, cw=3921)))],
    "anthropic_plan_cached.json": [ok(msg("msg_01PlanB2", "toolu_01PlanB2", "submit_plan", PLAN,
                                          usage(790, 388, cr=3921), thinking=True))],
    "anthropic_429_then_ok.json": [
        err(429, "rate_limit_error", "This request would exceed the rate limit for your organization of "
            "30,000 input tokens per minute.", headers={"retry-after-ms": "20"}),
        ok(msg("msg_01PlanC3", "toolu_01PlanC3", "submit_plan", PLAN, usage(812, 402, cw=3921)))],
    "anthropic_529_then_ok.json": [
        err(529, "overloaded_error", "Overloaded", headers={"retry-after-ms": "20"}),
        ok(msg("msg_01PlanD4", "toolu_01PlanD4", "submit_plan", PLAN, usage(812, 402, cr=3921)))],
    "anthropic_529_always.json": [err(529, "overloaded_error", "Overloaded", headers={"retry-after-ms": "10"})] * 2,
    "anthropic_malformed_then_ok.json": [
        ok(msg("msg_01CodeE5", "toolu_01CodeE5", "submit_candidate", CODE(NO_MODELNEW), usage(1020, 1410, cr=3200))),
        ok(msg("msg_01CodeF6", "toolu_01CodeF6", "submit_candidate", CODE(FIXED), usage(2460, 1405, cr=3200)))],
    "anthropic_debug_round.json": [
        ok(msg("msg_01CodeG7", "toolu_01CodeG7", "submit_candidate", CODE(BUGGY), usage(1020, 1410, cw=3200))),
        ok(msg("msg_01DbugH8", "toolu_01DbugH8", "submit_fix", DEBUG, usage(2380, 1500, cw=3050)))],
    "anthropic_analyze.json": [ok(msg("msg_01AnlzI9", "toolu_01AnlzI9", "submit_analysis", ANALYSIS,
                                      usage(1900, 310, cw=1710)))],
    "anthropic_forced_tool_rejected.json": [
        err(400, "invalid_request_error", "tool_choice: forced tool use is not supported with this model; "
            "use tool_choice {\"type\": \"auto\"}."),
        ok(msg("msg_01PlanJ1", "toolu_01PlanJ1", "submit_plan", PLAN, usage(830, 420, cw=3921),
               model="claude-opus-5", thinking=True))],
    "anthropic_preflight_ok.json": [models_ok],
    "anthropic_preflight_404.json": [
        err(404, "not_found_error", "model: claude-sonnet-9-9", path="/v1/models/claude-sonnet-9-9", method="GET")],
    "anthropic_preflight_401.json": [
        err(401, "authentication_error", "invalid x-api-key", path=f"/v1/models/{SONNET}", method="GET")],
}


def chat(cid, content, prompt, completion, cached=0, finish="stop"):
    return {"id": cid, "object": "chat.completion", "created": 1764400000, "model": LOCAL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": None,
                                                 "tool_calls": []},
                         "logprobs": None, "finish_reason": finish, "stop_reason": None}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": cached}},
            "system_fingerprint": None}


CP = "/v1/chat/completions"
models_list = {"object": "list", "data": [
    {"id": LOCAL, "object": "model", "created": 1764300000, "owned_by": "vllm", "root": LOCAL, "parent": None,
     "max_model_len": 32768}]}
rec.update({
    "openai_plan.json": [ok(chat("chatcmpl-a1", json.dumps(PLAN), 4210, 380, cached=3584), path=CP)],
    "openai_bad_json_then_ok.json": [
        ok(chat("chatcmpl-b2", "```json\n{\"bound\": \"memory\", \"pct_of_ceiling\": 71.5, \"evidence\": \"3.0 TB/s\"",
                2800, 40), path=CP),
        ok(chat("chatcmpl-c3", json.dumps(ANALYSIS), 2900, 160, cached=2560), path=CP)],
    "openai_429_then_ok.json": [
        {"request": {"method": "POST", "path": CP}, "response": {"status": 429, "headers": {
            "content-type": "application/json", "retry-after-ms": "20"}, "body": {"error": {
                "message": "Rate limit reached", "type": "requests", "param": None, "code": "rate_limit_exceeded"}}}},
        ok(chat("chatcmpl-d4", json.dumps(PLAN), 4210, 380), path=CP)],
    "openai_preflight_ok.json": [{"request": {"method": "GET", "path": "/v1/models"},
                                  "response": {"status": 200, "headers": {"content-type": "application/json"},
                                               "body": models_list}}],
})
# Expanding a node: the planner names nodes by source-hash ref; the first answer names a node that
# was not selected, the retry names the selected one.
from kernellab.problem import content_hash  # noqa: E402

_problem_src = (OUT.parents[3] / "experiments/problems/fusions/gemm_bias_gelu.py").read_text()
REF = content_hash(content_hash(_problem_src), FIXED)[:10]
EXPAND = lambda parent: {"proposals": [{"parent": parent, "idea": "Move the GEMM into the Triton kernel: "
                         "128x128x64 tiles, GROUP_M 8, epilogue on the accumulator.", "rationale": "The analyst "
                         "found the epilogue at 71% of bandwidth; the remaining gain is its traffic.",
                         "expected_gain": 1.2}]}
rec["anthropic_plan_expand.json"] = [
    ok(msg("msg_01PlanK2", "toolu_01PlanK2", "submit_plan", EXPAND("0123456789"), usage(1500, 300, cr=3921))),
    ok(msg("msg_01PlanL3", "toolu_01PlanL3", "submit_plan", EXPAND(REF), usage(1900, 300, cr=3921)))]
OUT.mkdir(parents=True, exist_ok=True)
for name, exchanges in rec.items():
    (OUT / name).write_text(json.dumps(exchanges, indent=1) + "\n")
print(len(rec), "files")
