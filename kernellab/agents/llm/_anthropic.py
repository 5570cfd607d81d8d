"""Claude through the official ``anthropic`` SDK: the answer is a forced tool call whose input schema
is the role's schema; the static system prompt (role prompt + skills) is marked for prompt caching."""

from __future__ import annotations

import os
from typing import Any

import anthropic

from ._backend import Backend, RebuildRequest, Usage
from ._errors import LLMError, LLMUnavailable, PreflightError
from ._pricing import Price, price_for
from ._schemas import RoleSchema

__all__ = ["AnthropicBackend"]

# Models whose API rejects a forced ``tool_choice`` with a 400 (Opus 5.5 and Sonnet 5.5 migration
# guides): they get ``tool_choice: auto`` and the instruction to call the tool; the answer loop
# retries a reply that does not. Any other model that rejects it is detected at its first call.
_NO_FORCED_TOOL = ("claude-opus-5-5", "claude-sonnet-5-5")


def _answer_blocks(content: list[dict]) -> list[dict]:
    """The assistant turn to send back in a retry: blocks as returned (thinking blocks must be passed
    back unchanged), less the response-only fields."""
    keep = {"text": ("type", "text"), "tool_use": ("type", "id", "name", "input"),
            "thinking": ("type", "thinking", "signature"), "redacted_thinking": ("type", "data")}
    out = []
    for b in content:
        fields = keep.get(b.get("type"))
        out.append({k: b[k] for k in fields if k in b} if fields else b)
    return out


class AnthropicBackend(Backend):
    provider = "anthropic"

    def __init__(self, model: str, *, api_key: str | None = None, http_client: Any = None,
                 max_retries: int = 4, timeout: float = 300.0, base_url: str | None = None,
                 cache_ttl: str | None = None, **kw: Any):
        super().__init__(model, **kw)
        self._key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY")
        self.secrets = (self._key,) if self._key else ()
        self._http_client, self._max_retries, self._timeout = http_client, max_retries, timeout
        self._base_url = base_url
        self._cache_control: dict = {"type": "ephemeral", **({"ttl": cache_ttl} if cache_ttl else {})}
        self.force_tool = not any(model.startswith(m) for m in _NO_FORCED_TOOL)
        self._client: anthropic.Anthropic | None = None

    def price(self) -> Price | None:
        return price_for(self.model, self.prices)

    @property
    def client(self) -> anthropic.Anthropic:
        if self._client is None:
            if not self._key:
                raise PreflightError("ANTHROPIC_API_KEY is not set: give it to this one command "
                                     "(ANTHROPIC_API_KEY=... kernellab run ...; README.md, Using an LLM), "
                                     "or use --llm builtin")
            # The SDK's own backoff handles 429, 529 overloaded, 5xx and timeouts (bounded by
            # max_retries, honouring retry-after); it reads no key from the environment here.
            self._client = anthropic.Anthropic(api_key=self._key, base_url=self._base_url,
                                               max_retries=self._max_retries, timeout=self._timeout,
                                               http_client=self._http_client)
        return self._client

    def _preflight_remote(self) -> None:
        client = self.client
        try:
            client.models.retrieve(self.model, timeout=30.0)
        except anthropic.AuthenticationError as e:
            raise PreflightError(f"ANTHROPIC_API_KEY was rejected by the Anthropic API ({e.status_code})") from None
        except anthropic.PermissionDeniedError as e:
            raise PreflightError(f"this ANTHROPIC_API_KEY may not use {self.model} ({e.status_code})") from None
        except anthropic.NotFoundError:
            raise PreflightError(f"unknown Anthropic model {self.model!r} (404 from the Models API); "
                                 "see https://platform.claude.com/docs/en/about-claude/models") from None
        except anthropic.APIConnectionError as e:
            raise PreflightError(f"cannot reach the Anthropic API at {client.base_url}: {e}") from None
        except anthropic.APIStatusError as e:
            raise PreflightError(f"the Anthropic API answered {e.status_code} to the model check: "
                                 f"{e.api_message or e.message}") from None

    def build(self, role: str, system: str, messages: list[dict], schema: RoleSchema) -> dict:
        tool = {"name": schema.name, "description": schema.description, "input_schema": schema.schema}
        choice = ({"type": "tool", "name": schema.name, "disable_parallel_tool_use": True} if self.force_tool
                  else {"type": "auto", "disable_parallel_tool_use": True})
        # Cache breakpoint on the system block: the prefix tools + system (role prompt and skills)
        # is identical for every call of a role in a campaign.
        return {"model": self.model, "max_tokens": self.max_tokens[role],
                "system": [{"type": "text", "text": system, "cache_control": self._cache_control}],
                "tools": [tool], "tool_choice": choice, "messages": messages}

    def send(self, request: dict) -> tuple[dict, int]:
        try:
            raw = self.client.messages.with_raw_response.create(**request)
        except anthropic.BadRequestError as e:
            msg = e.api_message or e.message
            if self.force_tool and "tool_choice" in str(msg):
                self.force_tool = False
                raise RebuildRequest() from None
            raise LLMError(f"the Anthropic API rejected the request (400): {msg}") from None
        except ValueError as e:  # the SDK refuses non-streaming calls it expects to exceed 10 minutes
            raise LLMError(f"{self.model}: {e} (lower max_tokens for this role)") from None
        except anthropic.APIConnectionError as e:  # includes timeouts, after the SDK's retries
            raise LLMUnavailable(f"Anthropic API unreachable after {self._max_retries} retries: {e}") from None
        except anthropic.APIStatusError as e:
            raise LLMUnavailable(f"Anthropic API error {e.status_code} after {self._max_retries} retries: "
                                 f"{e.api_message or e.message}") from None
        return raw.http_response.json(), raw.retries_taken

    def usage(self, body: dict) -> Usage:
        u = body.get("usage") or {}
        breakdown = u.get("cache_creation") or {}
        return Usage(input_tokens=u.get("input_tokens") or 0, output_tokens=u.get("output_tokens") or 0,
                     cache_read_tokens=u.get("cache_read_input_tokens") or 0,
                     cache_write_tokens=u.get("cache_creation_input_tokens") or 0,
                     cache_write_1h_tokens=breakdown.get("ephemeral_1h_input_tokens") or 0)

    def extract(self, body: dict, schema: RoleSchema) -> tuple[Any, list[str]]:
        calls = [b for b in body.get("content", []) if b.get("type") == "tool_use"]
        ours = [b for b in calls if b.get("name") == schema.name]
        if ours:
            return ours[0].get("input"), []
        if body.get("stop_reason") == "max_tokens":
            return None, ["your answer was cut off at max_tokens before the tool call was complete; "
                          "give a shorter answer"]
        if calls:
            return None, [f"you called {calls[0].get('name')!r}; the only tool is `{schema.name}`"]
        return None, [f"you answered in text; answer only by calling the tool `{schema.name}` once"]

    def followup(self, body: dict, schema: RoleSchema, problems: list[str]) -> list[dict]:
        text = ("Your answer was not accepted:\n" + "\n".join(f"- {p}" for p in problems)
                + f"\nCall `{schema.name}` again with the complete, corrected answer.")
        content = body.get("content", [])
        calls = [b for b in content if b.get("type") == "tool_use"]
        # every tool_use must be answered by a tool_result in the next user turn
        reply: list[dict] = [{"type": "tool_result", "tool_use_id": b["id"], "is_error": True, "content": text}
                             for b in calls]
        if not calls:
            reply = [{"type": "text", "text": text}]
        return [{"role": "assistant", "content": _answer_blocks(content) or [{"type": "text", "text": "(empty)"}]},
                {"role": "user", "content": reply}]
