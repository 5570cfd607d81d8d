"""Live progress of a campaign: a rich panel on a TTY, one plain line per event otherwise (a log
file, CI, a pipe), nothing with ``enabled=False`` (``--json``)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

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
    budget_candidates: int | None = None  # per problem
    budget_wall_s: float | None = None  # for the whole campaign
    budget_usd: float | None = None  # LLM dollars for the whole campaign
    elapsed_before: float = 0.0  # active seconds of earlier sessions (a resumed campaign)
    llm_tokens: int = 0
    llm_usd: float = 0.0
    last: str = ""
    cluster: str = ""  # a Dask cluster's workers, GPUs and jobs in flight (``--cluster``)
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def budget_left(self) -> str:
        parts = []
        if self.problems_total and self.problems_done >= self.problems_total:
            return "none needed, every problem is done"
        if self.budget_candidates is not None:
            # the budget counts candidates written (search.Budget), which a round writes before evaluating:
            # the ones in flight say why it falls faster than the evaluations
            parts.append(f"{max(0, self.budget_candidates - self.tree_size)} of {self.budget_candidates} candidates "
                         "for this problem" + (f" ({self.tree_size} written, {self.in_flight} of them in flight)"
                                               if self.in_flight else ""))
        if self.budget_wall_s is not None:
            parts.append(f"{max(0.0, self.budget_wall_s - self.elapsed):.0f} s of {self.budget_wall_s:g} s")
        if self.budget_usd is not None:
            parts.append(f"${max(0.0, self.budget_usd - self.llm_usd):.2f} of ${self.budget_usd:.2f} for LLM calls")
        return ", ".join(parts) or "no budget set"


class Progress:
    """Thread-safe; the campaign runner calls ``update``/``on_evaluation``. ``enabled=None``: the
    panel on a TTY, plain lines otherwise; ``True``: the panel; ``False``: silent."""

    def __init__(self, enabled: bool | None = None, console: Console | None = None, plain: bool | None = None):
        self.console = console or Console(stderr=True)
        tty = self.console.is_terminal
        self.enabled = True if enabled is None else enabled
        self.plain = (not tty if enabled is None else False) if plain is None else plain
        self.stats = Stats()
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._print_lock = threading.Lock()
        self._clock = lambda: self.stats.elapsed
        self._forked = False

    def fork(self, problem: str = "") -> Progress:
        """A progress of its own for one of several campaigns running at once (a bench's): its plain lines
        name its own problem and count its own evaluations (with one shared ``Stats``, every campaign's lines
        were put under the problem last started), printed whole through this one's console and stamped with
        this one's clock; ``problem`` names the campaign's lines until it says which problem it is on (a
        resumed campaign that only re-times says nothing of it). On a TTY the campaigns share this panel;
        silent, the fork is this one."""
        if not (self.enabled and self.plain):
            return self
        child = Progress(enabled=True, console=self.console, plain=True)
        child.stats.problem, child._forked = problem, True
        child._print_lock, child._clock = self._print_lock, self._clock
        return child

    def __enter__(self) -> Progress:
        if self.enabled and not self.plain:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the live panel (its last state stays on screen); what is printed after stays visible."""
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(None, None, None)
            self._live = None

    def seed(self, store: Any, campaign_id: str, elapsed_before: float = 0.0, problem: str = "",
             resumed: bool | str = False, problem_id: str | None = None) -> None:
        """Counts of the work done before this session, so that a resumed campaign's panel starts from them,
        and one line saying where it goes on (the first step of a resume may take a while to report)."""
        evals = [e for e in store.evaluations(campaign_id=campaign_id) if e["kind"] == "full"]
        with self._lock:
            s = self.stats
            s.evaluated = len(evals)
            s.failures = Counter(e.get("error_class") or e["status"] for e in evals if e["status"] != "correct")
            s.interpreted = any(e["interpreted"] for e in evals)
            s.problems_done = len({e["payload"].get("problem_id") for e in store.events(campaign_id, "stop")})
            s.elapsed_before = float(elapsed_before or 0.0)
            s.problem = problem or s.problem
            if problem_id is not None:  # the budget left counts the problem's candidates written before
                s.tree_size = len(store.candidates(campaign_id, problem_id))
        self._refresh()
        if resumed == "done":
            self.note(f"resumed: finished before ({s.evaluated} evaluated); only missing re-timings are done")
        elif resumed:
            where = f"problem {s.problem} ({min(s.problems_done + 1, s.problems_total)}/{s.problems_total})" \
                if s.problem else f"{s.problems_done}/{s.problems_total} problems done"
            self.note(f"resumed: {s.evaluated} evaluated before; going on with {where}")

    def update(self, **kw: object) -> None:
        with self._lock:
            before = (self.stats.problem, self.stats.problems_done)
            for k, v in kw.items():
                setattr(self.stats, k, v)
        if self.plain and self.enabled:
            s = self.stats
            if "problem" in kw and kw["problem"] != before[0]:
                self._line(f"problem {s.problem} ({s.problems_done + 1}/{s.problems_total})")
            if "problems_done" in kw and kw["problems_done"] != before[1]:
                # a bench's campaigns (forks) have one problem each: the line says which campaign finished
                who = f"{s.problem}: " if self._forked and s.problem else ""
                self._line(f"{who}{s.problems_done}/{s.problems_total} problems done")
            if kw.get("last"):
                fails = ", ".join(f"{k} {v}" for k, v in s.failures.most_common())
                self._line(f"{s.problem}: {s.last}; {s.evaluated} evaluated"
                           + (f" (failures: {fails})" if fails else "") + f"; budget left: {s.budget_left()}"
                           + (f"; cluster: {s.cluster}" if s.cluster else ""))
        self._refresh()

    def note(self, text: str) -> None:
        """One line for the reader, above the panel on a TTY (nothing with ``enabled=False``)."""
        if not self.enabled:
            return
        if self.plain:
            self._line(text)
        else:
            self.console.print(text)

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

    def _line(self, text: str) -> None:
        # one write per line: print() writes the text and its newline apart, and lines of campaigns running at
        # once ran together in a bench's log
        with self._print_lock:
            f = self.console.file
            f.write(f"kernellab [{self._clock():6.0f} s] {text}\n")
            f.flush()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _render(self) -> Table:
        s = self.stats
        t = Table(title=f"kernellab campaign {s.campaign}", show_header=False, expand=False)
        t.add_column(style="bold")
        t.add_column()
        t.add_row("problem", f"{s.problem} ({s.problems_done}/{s.problems_total} done)")
        t.add_row("candidates", f"{s.tree_size} in the tree, {s.evaluated} evaluated, {s.in_flight} in flight")
        if s.interpreted:
            t.add_row("best", "interpreted timings (CPU): no speedups claimed")
        else:
            fx = lambda v: "-" if v is None else f"{v:.2f}x"
            t.add_row("best", f"{fx(s.best_eager)} vs eager, {fx(s.best_compile)} vs torch.compile")
        t.add_row("failures", ", ".join(f"{k} {v}" for k, v in s.failures.most_common()) or "none")
        t.add_row("time", f"{s.elapsed:.0f} s elapsed; budget left: {s.budget_left()}")
        t.add_row("LLM", f"{s.llm_tokens} tokens, ${s.llm_usd:.2f}")
        if s.cluster:
            t.add_row("cluster", s.cluster)
        if s.last:
            t.add_row("last", s.last[:100])
        return t
