"""Live progress of a campaign: a rich panel on a TTY, silence otherwise (scripts use ``--json``)."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live
from rich.table import Table


@dataclass
class Stats:
    campaign: str = ""
    problem: str = ""
    problems_done: int = 0
    problems_total: int = 0
    evaluated: int = 0
    in_flight: int = 0
    tree_size: int = 0
    best_eager: float | None = None
    best_compile: float | None = None
    interpreted: bool = False
    failures: Counter = field(default_factory=Counter)
    budget: str = ""
    llm_tokens: int = 0
    llm_usd: float = 0.0
    last: str = ""
    started: float = field(default_factory=time.monotonic)


class Progress:
    """Thread-safe; the campaign runner calls the ``on_*`` hooks. ``enabled=None`` = only on a TTY."""

    def __init__(self, enabled: bool | None = None, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.stats = Stats()
        self._lock = threading.Lock()
        self._live: Live | None = None

    def __enter__(self) -> Progress:
        if self.enabled:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(None, None, None)
            self._live = None

    def update(self, **kw: object) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self.stats, k, v)
        self._refresh()

    def on_evaluation(self, result: dict) -> None:
        with self._lock:
            s = self.stats
            s.evaluated += 1
            if result["status"] != "correct":
                s.failures[result.get("error_class") or result["status"]] += 1
            if result.get("interpreted"):
                s.interpreted = True
            for key, attr in (("speedup_eager", "best_eager"), ("speedup_compile", "best_compile")):
                v = result.get(key)
                if result["status"] == "correct" and v is not None and (getattr(s, attr) is None or v > getattr(s, attr)):
                    setattr(s, attr, v)
        self._refresh()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _render(self) -> Table:
        s = self.stats
        t = Table(title=f"kernellab campaign {s.campaign}", show_header=False, expand=False)
        t.add_column(style="bold")
        t.add_column()
        elapsed = time.monotonic() - s.started
        t.add_row("problem", f"{s.problem} ({s.problems_done}/{s.problems_total} done)")
        t.add_row("candidates", f"{s.tree_size} in the tree, {s.evaluated} evaluated, {s.in_flight} in flight")
        if s.interpreted:
            t.add_row("best", "interpreted timings (CPU): no speedups claimed")
        else:
            fx = lambda v: "-" if v is None else f"{v:.2f}x"
            t.add_row("best", f"{fx(s.best_eager)} vs eager, {fx(s.best_compile)} vs torch.compile")
        t.add_row("failures", ", ".join(f"{k} {v}" for k, v in s.failures.most_common()) or "none")
        t.add_row("time", f"{elapsed:.0f} s elapsed; budget left: {s.budget}")
        t.add_row("LLM", f"{s.llm_tokens} tokens, ${s.llm_usd:.2f}")
        if s.last:
            t.add_row("last", s.last[:100])
        return t
