"""Dollar prices of the hosted models, per million tokens.

Source: https://platform.claude.com/docs/en/about-claude/pricing (model pricing table) and the model
pages / migration guides linked from it, read on **2026-11-29**. Prices change: pass ``prices=`` to
:func:`kernellab.agents.llm.make_agents` to override, and update ``PRICES_DATE`` with the table.

Cache writes are billed at 1.25x the input price for the default 5-minute TTL (2x for 1 hour), cache
reads at the "cache hits" price; ``input_tokens`` as the Messages API reports it excludes both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Price", "PRICES", "PRICES_DATE", "price_for", "cost_usd"]

PRICES_DATE = "2026-11-29"


@dataclass(frozen=True)
class Price:
    input: float  # $ per million uncached input tokens
    output: float
    cache_write_5m: float
    cache_write_1h: float
    cache_read: float


def _p(inp: float, out: float, read: float) -> Price:
    return Price(inp, out, inp * 1.25, inp * 2.0, read)


PRICES: dict[str, Price] = {
    # anthropic (claude-* ids; a date suffix such as -20250929 is ignored when looking up)
    "claude-fable-5-1": _p(10.0, 50.0, 0.25),
    "claude-fable-5": _p(10.0, 50.0, 1.0),
    "claude-opus-5-5": _p(4.0, 20.0, 0.20),  # Opus 5.5 migration guide coverage: $4/$20, reads $0.20
    "claude-opus-5": _p(5.0, 25.0, 0.50),
    "claude-opus-4-8": _p(5.0, 25.0, 0.50),
    "claude-opus-4-7": _p(5.0, 25.0, 0.50),
    "claude-opus-4-6": _p(5.0, 25.0, 0.50),
    "claude-opus-4-5": _p(5.0, 25.0, 0.50),
    "claude-opus-4-1": _p(15.0, 75.0, 1.50),
    "claude-opus-4": _p(15.0, 75.0, 1.50),
    "claude-sonnet-5-5": _p(2.0, 10.0, 0.10),  # cache reads halved to $0.10 on 2026-10-07
    "claude-sonnet-5": _p(2.0, 10.0, 0.20),
    "claude-sonnet-4-6": _p(3.0, 15.0, 0.30),
    "claude-sonnet-4-5": _p(3.0, 15.0, 0.30),
    "claude-sonnet-4": _p(3.0, 15.0, 0.30),
    "claude-3-7-sonnet": _p(3.0, 15.0, 0.30),
    "claude-haiku-4-5": _p(1.0, 5.0, 0.10),
    "claude-3-5-haiku": _p(0.80, 4.0, 0.08),
    "claude-3-haiku": Price(0.25, 1.25, 0.30, 0.50, 0.03),
}

_DATE_SUFFIX = re.compile(r"-(\d{8}|latest)$")


def price_for(model: str, prices: dict[str, Price] | None = None) -> Price | None:
    table = PRICES if prices is None else {**PRICES, **prices}
    if model in table:
        return table[model]
    base = _DATE_SUFFIX.sub("", model.removesuffix("[1m]"))
    return table.get(base)


def cost_usd(price: Price | None, *, input_tokens: int, output_tokens: int, cache_read_tokens: int = 0,
             cache_write_5m_tokens: int = 0, cache_write_1h_tokens: int = 0) -> float | None:
    if price is None:
        return None
    return (input_tokens * price.input + output_tokens * price.output
            + cache_read_tokens * price.cache_read + cache_write_5m_tokens * price.cache_write_5m
            + cache_write_1h_tokens * price.cache_write_1h) / 1e6
