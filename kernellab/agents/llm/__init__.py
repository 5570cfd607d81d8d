"""LLM-backed agents: Claude (``anthropic:<model>``) and OpenAI-compatible servers
(``openai:<model>`` with ``base_url`` for vLLM, llama.cpp, Ollama) behind one :class:`Backend`.

Every model call is an ``llm_calls`` row (request, response, tokens, dollars, prompt version,
request hash); ``replay=`` answers from those rows with no network.
"""

from __future__ import annotations

from ..roles import Analysis, Code, Diagnosis, Proposal
from ._agents import LLMAgents, make_agents, node_ref, preflight
from ._anthropic import AnthropicBackend
from ._backend import Backend, CallInfo, ReplaySource, Usage, request_hash, scrub
from ._errors import BudgetExceeded, InvalidOutput, LLMError, LLMUnavailable, PreflightError, ReplayMiss
from ._openai import OpenAIBackend
from ._pricing import PRICES, PRICES_DATE, Price, price_for
from ._prompts import ROLE_SKILLS, prompts_version, system_prompt
from ._schemas import SCHEMAS, RoleSchema, check_source

__all__ = [
    "LLMAgents", "make_agents", "preflight", "node_ref", "Proposal", "Code", "Diagnosis", "Analysis",
    "Backend", "AnthropicBackend", "OpenAIBackend", "CallInfo", "Usage", "ReplaySource",
    "request_hash", "scrub",
    "LLMError", "PreflightError", "BudgetExceeded", "LLMUnavailable", "InvalidOutput", "ReplayMiss",
    "PRICES", "PRICES_DATE", "Price", "price_for", "ROLE_SKILLS", "system_prompt", "prompts_version",
    "SCHEMAS", "RoleSchema", "check_source",
]
