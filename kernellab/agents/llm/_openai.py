"""OpenAI-compatible servers (OpenAI, vLLM, llama.cpp, Ollama) through the official ``openai`` SDK:
the answer is a JSON object constrained by a ``json_schema`` response format."""

from __future__ import annotations

import json
import os
import re
from typing import Any
from urllib.parse import urlsplit

import openai

from ._backend import Backend, Usage
from ._errors import LLMError, LLMUnavailable, PreflightError
from ._pricing import Price, price_for
from ._schemas import RoleSchema

__all__ = ["OpenAIBackend", "LOCAL_KEY"]

# Local servers ignore the key but the SDK requires one; this placeholder is not a secret.
LOCAL_KEY = "kernellab-local"
_FENCE = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.S)


def _is_hosted(base_url: str | None) -> bool:
    return base_url is None or urlsplit(base_url).hostname == "api.openai.com"


def _where(base_url: str | None) -> str:
    if base_url is None:
        return "api.openai.com"
    parts = urlsplit(base_url)  # never echo credentials embedded in a URL
    return f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}{parts.path}"


class OpenAIBackend(Backend):
    provider = "openai"

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 http_client: Any = None, max_retries: int = 4, timeout: float = 600.0, **kw: Any):
        super().__init__(model, **kw)
        self.base_url = base_url
        self.hosted = _is_hosted(base_url)
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._key = key or (None if self.hosted else LOCAL_KEY)
        self.secrets = (key,) if key else ()
        self._http_client, self._max_retries, self._timeout = http_client, max_retries, timeout
        self._client: openai.OpenAI | None = None

    def price(self) -> Price | None:
        if not self.hosted:
            return Price(0.0, 0.0, 0.0, 0.0, 0.0)  # a local server costs no dollars per token
        return price_for(self.model, self.prices)

    @property
    def client(self) -> openai.OpenAI:
        if self._client is None:
            if not self._key:
                raise PreflightError("OPENAI_API_KEY is not set (needed for api.openai.com); "
                                     "for a local server pass --base-url")
            self._client = openai.OpenAI(api_key=self._key, base_url=self.base_url, max_retries=self._max_retries,
                                         timeout=self._timeout, http_client=self._http_client)
        return self._client

    def _preflight_remote(self) -> None:
        client, where = self.client, _where(self.base_url)
        try:
            ids = [m.id for m in client.models.list(timeout=30.0)]
        except openai.AuthenticationError as e:
            raise PreflightError(f"the API key was rejected by {where} ({e.status_code})") from None
        except openai.NotFoundError:
            ids = None  # a server without /models: check the model itself below
        except openai.APIConnectionError as e:
            raise PreflightError(f"cannot reach the OpenAI-compatible server at {where}: {e}") from None
        except openai.APIStatusError as e:
            raise PreflightError(f"{where} answered {e.status_code} to the model list: {e.message}") from None
        if ids is None:
            try:
                client.models.retrieve(self.model, timeout=30.0)
                return
            except openai.NotFoundError:
                raise PreflightError(f"unknown model {self.model!r} at {where} (404)") from None
            except openai.APIError as e:
                raise PreflightError(f"{where} cannot check model {self.model!r}: {e}") from None
        if self.model not in ids:
            offered = ", ".join(ids[:12]) + (" ..." if len(ids) > 12 else "")
            raise PreflightError(f"unknown model {self.model!r} at {where}; it serves: {offered or 'nothing'}")

    def build(self, role: str, system: str, messages: list[dict], schema: RoleSchema) -> dict:
        # api.openai.com wants max_completion_tokens; vLLM, llama.cpp and Ollama read max_tokens
        limit = "max_completion_tokens" if self.hosted else "max_tokens"
        return {"model": self.model, limit: self.max_tokens[role],
                "messages": [{"role": "system", "content": system}, *messages],
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": schema.name, "description": schema.description, "schema": schema.schema,
                    "strict": True}}}

    def send(self, request: dict) -> tuple[dict, int]:
        try:
            raw = self.client.chat.completions.with_raw_response.create(**request)
        except openai.BadRequestError as e:
            raise LLMError(f"{_where(self.base_url)} rejected the request (400): {e.message}") from None
        except openai.APIConnectionError as e:  # includes timeouts, after the SDK's retries
            raise LLMUnavailable(f"{_where(self.base_url)} unreachable after {self._max_retries} retries: "
                                 f"{e}") from None
        except openai.APIStatusError as e:
            raise LLMUnavailable(f"{_where(self.base_url)} error {e.status_code} after {self._max_retries} "
                                 f"retries: {e.message}") from None
        return raw.http_response.json(), raw.retries_taken

    def usage(self, body: dict) -> Usage:
        u = body.get("usage") or {}
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return Usage(input_tokens=(u.get("prompt_tokens") or 0) - cached,
                     output_tokens=u.get("completion_tokens") or 0, cache_read_tokens=cached)

    def extract(self, body: dict, schema: RoleSchema) -> tuple[Any, list[str]]:
        choices = body.get("choices") or []
        if not choices:
            return None, ["the reply had no choices"]
        msg, finish = choices[0].get("message") or {}, choices[0].get("finish_reason")
        if msg.get("refusal"):
            return None, [f"you refused: {msg['refusal'][:200]}; this is a benign performance-engineering task"]
        text = msg.get("content") or ""
        if finish == "length":
            return None, ["your answer was cut off at the token limit; give a shorter answer"]
        m = _FENCE.match(text)
        text = m.group(1) if m else text
        try:
            return json.loads(text), []
        except json.JSONDecodeError as e:
            return None, [f"your reply is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                          f"reply with one JSON object for `{schema.name}` and nothing else"]

    def followup(self, body: dict, schema: RoleSchema, problems: list[str]) -> list[dict]:
        choices = body.get("choices") or [{}]
        said = (choices[0].get("message") or {}).get("content") or ""
        text = ("Your answer was not accepted:\n" + "\n".join(f"- {p}" for p in problems)
                + "\nReply with the complete, corrected JSON object only.")
        return [{"role": "assistant", "content": said}, {"role": "user", "content": text}]
