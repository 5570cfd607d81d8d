"""Errors of the LLM agents. Each message is one line a user can act on; none contains a key."""

from __future__ import annotations

__all__ = ["LLMError", "PreflightError", "BudgetExceeded", "LLMUnavailable", "InvalidOutput", "ReplayMiss"]


class LLMError(RuntimeError):
    """Base class of every error raised by ``kernellab.agents.llm``."""


class PreflightError(LLMError):
    """The backend cannot be used at all (missing key, unreachable server, unknown model, no price
    for a dollar budget, nothing to replay). Raised before any work; the CLI maps it to exit 2."""


class BudgetExceeded(LLMError):
    """The campaign's LLM dollar budget is spent. The campaign is resumable with a larger budget."""


class LLMUnavailable(LLMError):
    """The API failed after the bounded retries (rate limits, overload, timeouts, server errors)
    in the middle of a campaign: stop, save, resume later."""


class InvalidOutput(LLMError):
    """The model gave no valid structured answer within the allowed attempts."""


class ReplayMiss(LLMError):
    """Replay mode met a call the replayed campaign never made (the run diverged from it)."""
