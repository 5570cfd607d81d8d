"""The provider-independent half of an LLM backend: one structured call per role with bounded
validation retries, token and dollar accounting, a dollar budget, key scrubbing, and record/replay
through the ``llm_calls`` table.

A provider (Anthropic, OpenAI-compatible) supplies five small hooks: ``build`` a request, ``send`` it,
read its ``usage``, ``extract`` the structured answer, and the ``followup`` messages of a retry.
Transport retries (429, 529 overloaded, 5xx, timeouts) are the SDK's own bounded exponential backoff
(``max_retries``); answer retries (invalid JSON, code without ``ModelNew``...) are this loop's.
"""

from __future__ import annotations

import abc
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from kernellab.problem import content_hash
from kernellab.store import BaseStore, canonical_json

from ._errors import BudgetExceeded, InvalidOutput, LLMError, PreflightError, ReplayMiss
from ._pricing import Price, cost_usd
from ._schemas import RoleSchema

__all__ = ["Backend", "CallInfo", "Usage", "ReplaySource", "request_hash", "scrub", "RebuildRequest"]

REDACTED = "[REDACTED]"
# Key shapes of the providers we talk to, scrubbed even when they are not this backend's own key.
_KEY_PATTERNS = re.compile(r"sk-ant-[A-Za-z0-9_\-]{8,}|sk-(?:proj-)?[A-Za-z0-9_\-]{20,}")


def scrub(obj: Any, secrets: tuple[str, ...] = ()) -> Any:
    """``obj`` with every secret (and anything shaped like an API key) replaced by ``[REDACTED]``."""
    if isinstance(obj, str):
        for s in secrets:
            if s and len(s) >= 8:
                obj = obj.replace(s, REDACTED)
        return _KEY_PATTERNS.sub(REDACTED, obj)
    if isinstance(obj, dict):
        return {k: scrub(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v, secrets) for v in obj]
    return obj


def request_hash(provider: str, request: dict) -> str:
    """The replay key of a request: the hash of its canonical JSON (sorted keys, no headers, no key)."""
    return content_hash(provider, canonical_json(request), n=32)


class RebuildRequest(Exception):
    """Raised by a provider's ``send`` when the request must be built again differently (e.g. the
    model rejects a forced ``tool_choice``); the loop rebuilds once and sends again."""


@dataclass
class Usage:
    input_tokens: int = 0  # uncached input, billed at the base input price
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0  # all cache writes (5m + 1h)
    cache_write_1h_tokens: int = 0  # the part of cache_write_tokens written with a 1-hour TTL

    def cost(self, price: Price | None) -> float | None:
        return cost_usd(price, input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                        cache_read_tokens=self.cache_read_tokens,
                        cache_write_5m_tokens=self.cache_write_tokens - self.cache_write_1h_tokens,
                        cache_write_1h_tokens=self.cache_write_1h_tokens)


@dataclass
class CallInfo:
    """What one ``complete`` cost, summed over its attempts (each attempt is one ``llm_calls`` row)."""

    role: str
    model: str
    prompt_version: str
    attempts: int = 0
    call_ids: list[str] = field(default_factory=list)
    request_hash: str = ""  # of the last attempt
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = 0.0
    latency_s: float = 0.0
    transport_retries: int = 0  # 429/529/5xx/timeouts retried by the SDK
    replayed: bool = False
    problems: list[list[str]] = field(default_factory=list)  # per rejected attempt


class ReplaySource:
    """Recorded answers, looked up first by exact request hash, then by the call's *replay key*
    (provider, model, role and the campaign-independent identity of what was asked: e.g. the
    candidate's source hash and error class for a debug call). The second lookup is what lets a
    replay with another search policy or budget reuse answers although timings in its prompts differ.
    The n-th identical call gets the n-th recorded answer."""

    def __init__(self, store: BaseStore, campaign_id: str | None = None):
        self.store, self.campaign_id = store, campaign_id
        self._by_hash: dict[str, list[dict]] | None = None
        self._by_key: dict[str, list[dict]] = defaultdict(list)
        self._used: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def _load(self) -> None:
        if self._by_hash is not None:
            return
        self._by_hash = defaultdict(list)
        for row in self.store.llm_calls(campaign_id=self.campaign_id):
            response = row.get("response") or {}
            if response.get("body") is None:  # a failed call: nothing to replay
                continue
            self._by_hash[row["request_hash"]].append(row)
            key = (row.get("request") or {}).get("replay_key")
            if key:
                self._by_key[key].append(row)

    def __len__(self) -> int:
        with self._lock:
            self._load()
            return sum(len(v) for v in self._by_hash.values())

    def take(self, rhash: str, key: str | None) -> dict | None:
        with self._lock:
            self._load()
            for label, rows in (("h:" + rhash, self._by_hash.get(rhash)),
                                ("k:" + (key or ""), self._by_key.get(key) if key else None)):
                if rows:
                    n = self._used[label]
                    self._used[label] += 1
                    # more identical calls than recorded: the last answer stands for the rest
                    return rows[min(n, len(rows) - 1)]
            return None


class Backend(abc.ABC):
    """One model behind one provider. Thread-safe: the graph may call it from parallel branches."""

    provider: str = ""

    def __init__(self, model: str, *, store: BaseStore | None = None, campaign_id: str | None = None,
                 replay: ReplaySource | None = None, budget_usd: float | None = None,
                 max_attempts: int = 3, max_tokens: dict[str, int] | None = None,
                 prices: dict[str, Price] | None = None):
        if not model:
            raise PreflightError(f"{self.provider}: no model named (use --llm {self.provider}:<model>)")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.model = model
        self.store, self.campaign_id, self.replay = store, campaign_id, replay
        self.budget_usd = budget_usd
        self.max_attempts = max_attempts
        self.max_tokens = {"planner": 4096, "coder": 16000, "debugger": 16000, "analyst": 2048,
                           **(max_tokens or {})}
        self.prices = prices
        self.secrets: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self.spent_usd = self._spent_so_far()

    @property
    def spec(self) -> str:
        return f"{self.provider}:{self.model}"

    # -- provider hooks --------------------------------------------------------------------------
    @abc.abstractmethod
    def price(self) -> Price | None: ...

    @abc.abstractmethod
    def _preflight_remote(self) -> None:
        """Check key, server and model with one cheap request; raise PreflightError."""

    @abc.abstractmethod
    def build(self, role: str, system: str, messages: list[dict], schema: RoleSchema) -> dict: ...

    @abc.abstractmethod
    def send(self, request: dict) -> tuple[dict, int]:
        """The response body (the API's JSON) and the number of transport retries taken."""

    @abc.abstractmethod
    def usage(self, body: dict) -> Usage: ...

    @abc.abstractmethod
    def extract(self, body: dict, schema: RoleSchema) -> tuple[Any, list[str]]: ...

    @abc.abstractmethod
    def followup(self, body: dict, schema: RoleSchema, problems: list[str]) -> list[dict]: ...

    # -- public ----------------------------------------------------------------------------------
    def preflight(self) -> None:
        """Raise :class:`PreflightError` with a one-line reason if this backend cannot work."""
        if self.replay is not None:
            if len(self.replay) == 0:
                where = f"campaign {self.replay.campaign_id}" if self.replay.campaign_id else "the store"
                raise PreflightError(f"nothing to replay: {where} has no recorded LLM answers")
            return
        if self.budget_usd is not None and self.price() is None:
            raise PreflightError(f"no price known for {self.spec} (table dated in kernellab.agents.llm."
                                 "_pricing); pass prices= or run without a dollar budget")
        self._preflight_remote()

    def complete(self, role: str, system: str, messages: list[dict], schema: RoleSchema, *,
                 context: dict | None = None, prompt_version: str = "", replay_key: str | None = None,
                 candidate_id: str | None = None) -> tuple[dict, CallInfo]:
        """Ask for ``schema``'s structured answer; retry (bounded) with what was wrong; return the
        validated answer and what it cost. Raises InvalidOutput, BudgetExceeded, LLMUnavailable,
        ReplayMiss."""
        info = CallInfo(role=role, model=self.model, prompt_version=prompt_version)
        msgs = list(messages)
        problems: list[str] = []
        for attempt in range(1, self.max_attempts + 1):
            answer, problems, body = self._one_call(role, system, msgs, schema, context, info, attempt,
                                                    replay_key, candidate_id)
            if not problems:
                return answer, info
            info.problems.append(problems)
            msgs = msgs + self.followup(body, schema, problems)
        raise InvalidOutput(f"{self.spec} gave no valid {role} answer in {self.max_attempts} attempts; "
                            f"last problems: {'; '.join(problems)[:400]}")

    # -- internals -------------------------------------------------------------------------------
    def _spent_so_far(self) -> float:
        """Resuming a campaign resumes its spending: the budget covers the whole campaign."""
        if self.store is None or self.campaign_id is None:
            return 0.0
        total = 0.0
        for row in self.store.llm_calls(campaign_id=self.campaign_id):
            total += row.get("cost_usd") or (row.get("response") or {}).get("replayed_cost_usd") or 0.0
        return total

    def _one_call(self, role: str, system: str, msgs: list[dict], schema: RoleSchema, context: dict | None,
                  info: CallInfo, attempt: int, replay_key: str | None,
                  candidate_id: str | None) -> tuple[Any, list[str], dict]:
        with self._lock:
            if self.budget_usd is not None and self.spent_usd >= self.budget_usd:
                raise BudgetExceeded(f"LLM budget of ${self.budget_usd:.2f} spent (${self.spent_usd:.4f}); "
                                     "the campaign is saved: resume it with a larger budget")
        key = f"{self.spec}|{role}|{replay_key}#{attempt}" if replay_key else None
        request = scrub(self.build(role, system, msgs, schema), self.secrets)
        rhash = request_hash(self.provider, request)
        usage, body, retries, replay_of, replayed_cost, error = Usage(), None, 0, None, None, None
        t0 = time.perf_counter()
        if self.replay is not None:
            row = self.replay.take(rhash, key)
            if row is None:
                raise ReplayMiss(f"no recorded {role} answer for request {rhash[:12]} (key {key}) to replay: "
                                 "this run asked something the replayed campaign never asked")
            body = row["response"]["body"]
            replay_of = row["id"]
            replayed_cost = row.get("cost_usd") or row["response"].get("replayed_cost_usd") or 0.0
            usage = Usage(row.get("input_tokens") or 0, row.get("output_tokens") or 0,
                          row.get("cache_read_tokens") or 0, row.get("cache_write_tokens") or 0)
            cost = 0.0  # nothing was spent; the budget still counts the recorded cost (same stop points)
        else:
            try:
                try:
                    body, retries = self.send(request)
                except RebuildRequest:
                    request = scrub(self.build(role, system, msgs, schema), self.secrets)
                    rhash = request_hash(self.provider, request)
                    body, retries = self.send(request)
                usage = self.usage(body)
            except LLMError as e:
                error = str(e)
                raise
            finally:
                if body is None:  # record the failure too: every attempt gets a row
                    self._record(role, request, rhash, key, attempt, None, Usage(), None,
                                 time.perf_counter() - t0, 0, info.prompt_version, candidate_id, error=error)
            cost = usage.cost(self.price())
        body = scrub(body, self.secrets)
        latency = time.perf_counter() - t0
        answer, problems = self.extract(body, schema)
        if not problems:
            problems = schema.problems(answer, context)
        with self._lock:
            self.spent_usd += replayed_cost if replay_of else (cost or 0.0)
        call_id = self._record(role, request, rhash, key, attempt, body, usage, cost, latency, retries,
                               info.prompt_version, candidate_id, replay_of=replay_of,
                               replayed_cost=replayed_cost, problems=problems)
        info.attempts = attempt
        info.call_ids.append(call_id)
        info.request_hash = rhash
        info.input_tokens += usage.input_tokens
        info.output_tokens += usage.output_tokens
        info.cache_read_tokens += usage.cache_read_tokens
        info.cache_write_tokens += usage.cache_write_tokens
        info.cost_usd = None if (cost is None or info.cost_usd is None) else info.cost_usd + cost
        info.latency_s += latency
        info.transport_retries += retries
        info.replayed = replay_of is not None
        return answer, problems, body

    def _record(self, role: str, request: dict, rhash: str, key: str | None, attempt: int, body: dict | None,
                usage: Usage, cost: float | None, latency: float, retries: int, prompt_version: str,
                candidate_id: str | None, *, error: str | None = None, replay_of: str | None = None,
                replayed_cost: float | None = None, problems: list[str] | None = None) -> str:
        response: dict[str, Any] = {"body": body, "transport_retries": retries}
        if problems:
            response["rejected"] = problems  # why this answer was not accepted (and retried)
        if error:
            response["error"] = error
        if replay_of:
            response["replay_of"] = replay_of
            response["replayed_cost_usd"] = replayed_cost
        row = {"campaign_id": self.campaign_id, "candidate_id": candidate_id, "role": role,
               "model": self.model, "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
               "cache_read_tokens": usage.cache_read_tokens, "cache_write_tokens": usage.cache_write_tokens,
               "cost_usd": cost, "latency_s": round(latency, 4), "request_hash": rhash,
               "request_json": scrub({"provider": self.provider, "model": self.model, "replay_key": key,
                                      "attempt": attempt, "request": request}, self.secrets),
               "response_json": scrub(response, self.secrets), "prompt_version": prompt_version}
        if self.store is None:
            return content_hash(rhash, str(attempt), str(time.time_ns()))
        return self.store.add_llm_call(row)
