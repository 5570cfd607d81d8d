"""Human-readable rendering of store records and results (rich tables); ``--json`` bypasses it."""

from __future__ import annotations

from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.syntax import Syntax
from rich.table import Table

PIPE_WIDTH = 10_000  # off a terminal: as wide as any line we print, so that nothing is folded or cut


class _Console(Console):
    """A console that, off a terminal (a pipe, a file), is as wide as its lines: rich assumes 80 columns there,
    which cut `show`'s source, split `optimize`'s words into 11-line cells and `lineage`'s actions to 9
    characters. Decided at each print, since the same process may print to a terminal and to a pipe."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal or self._width is not None else ConsoleDimensions(PIPE_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


console = _Console()


def fmt_x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g} ms"


def fmt_band(r: dict) -> str:
    if r.get("median_ms") is None:
        return "-"
    if r.get("p20_ms") is None or r.get("p80_ms") is None:
        return fmt_ms(r["median_ms"])
    return f"{fmt_ms(r['median_ms'])} ({r['p20_ms']:.4g}-{r['p80_ms']:.4g})"


def fmt_xband(v: float | None, band: list[float] | None) -> str:
    return fmt_x(v) if v is None or not band else f"{fmt_x(v)} ({band[0]:.2f}-{band[1]:.2f})"


def print_campaigns(rows: list[dict]) -> None:
    if not rows:
        console.print("no campaigns in this store")
        return
    t = Table(title="campaigns")
    for col in ("id", "name", "status", "created", "device"):
        t.add_column(col, overflow="fold")  # ids and names whole, folded at worst, never cut
    for r in rows:
        t.add_row(r["id"], r["name"], status_text(r), r["created_at"][:19], r["device"] or "")
    console.print(t)


def status_text(camp: dict) -> str:
    """A campaign's status; a ``running`` one whose process is gone (``campaign.is_stale``) says so."""
    return "running (stale: no process)" if camp.get("stale") else camp["status"]


def print_summary(s: dict) -> None:
    c = s["campaign"]
    console.print(f"[bold]{c['name']}[/] ({c['id']}) status={status_text(c)} device={c['device']}")
    console.print(f"candidates {s['candidates']}, evaluations {s['evaluations']}, "
                  f"statuses {s['statuses'] or '{}'}, LLM calls {s['llm']['calls']} "
                  f"(${s['llm']['cost_usd']:.2f})")
    t = Table(title="best correct candidate per problem")
    # names and ids whole (they are what the next command takes); other columns wrap instead
    names = [b["problem"] or b["problem_id"] for b in s["best"]]
    t.add_column("problem", no_wrap=True, min_width=min(48, max((len(n) for n in names), default=7)))
    t.add_column("candidate", no_wrap=True, min_width=12)
    interpreted = bool(s["best"]) and all(b["interpreted"] for b in s["best"])
    # speedup columns only where a speedup can be claimed: an interpreted campaign has none
    # (and no note column: the line under the table says it for every row)
    cols = ("time (p20-p80)",) if interpreted else ("time (p20-p80)", "vs eager", "vs compile", "note")
    for col in cols:
        t.add_column(col)
    for name, b in zip(names, s["best"], strict=True):
        notes = ["interpreted"] if b["interpreted"] else []
        notes += ["library only"] if b["library_only"] else []
        notes.append("re-timed" if b.get("retimed") else "not re-timed")
        if b.get("win_eager") is not None or b.get("win_compile") is not None:
            notes.append("band clears " + (" and ".join(n for n, w in (("eager", b.get("win_eager")),
                                                                      ("compile", b.get("win_compile"))) if w)
                                           or "no baseline"))
        rest = () if interpreted else (fmt_xband(b["speedup_eager"], b.get("speedup_eager_p20_p80")),
                                       fmt_xband(b["speedup_compile"], b.get("speedup_compile_p20_p80")),
                                       ", ".join(notes))
        t.add_row(name, b["candidate_id"][:12], fmt_band(b), *rest)
    console.print(t)
    if interpreted:
        console.print("times are interpreted (Triton interpreter on the CPU): no speedup claimed")
    elif any(b["interpreted"] for b in s["best"]):
        console.print("interpreted: timed in the Triton interpreter on the CPU; no speedup claimed")


def print_candidate(obj: dict, source: bool = True) -> None:
    c = obj["candidate"]
    console.print(f"[bold]candidate {c['id']}[/] depth {c['depth']} origin {c['origin']} "
                  f"language {c['language']} parent {c['parent_id'] or '-'}")
    console.print(f"action: {c['action'] or '-'}")
    if obj.get("problem"):
        p = obj["problem"]
        console.print(f"problem: {p.get('name') or p['id']} (mode {p['mode']})")
        for text in p.get("instances") or []:
            console.print(f"instance: {text}")
    t = Table(title="evaluations")
    for col in ("kind", "status", "config", "time", "p20-p80", "vs eager", "vs compile", "error"):
        t.add_column(col)
    for e in obj["evaluations"]:
        band = "-" if e["p20_ms"] is None else f"{e['p20_ms']:.4g}-{e['p80_ms']:.4g}"
        t.add_row(e["kind"], e["status"], str(e["config"] or {}), fmt_ms(e["median_ms"]), band,
                  fmt_x(e["speedup_eager"]), fmt_x(e["speedup_compile"]),
                  (e["error_text"] or "")[:60])
    console.print(t)
    for e in obj["evaluations"]:
        if e.get("metrics"):
            mt = Table(title=f"metrics of evaluation {e['id']}")
            for col in ("kernel", "metric", "value"):
                mt.add_column(col)
            for m in e["metrics"]:
                mt.add_row(m["kernel"][:40], m["name"], f"{m['value']:.4g}")
            console.print(mt)
    if source:
        if console.is_terminal:
            console.print(Syntax(c["source"], "python", line_numbers=True))
        else:  # the file as it is (Syntax pads every line to the console's width)
            console.print(c["source"], markup=False, highlight=False, soft_wrap=True, end="")


def print_lineage(steps: list[dict]) -> None:
    t = Table(title="lineage (root first)")
    for col in ("depth", "candidate", "action", "status", "time", "vs eager", "vs compile"):
        t.add_column(col, no_wrap=col == "candidate", min_width=12 if col == "candidate" else None)
    for s in steps:
        e = s["evaluations"][-1] if s["evaluations"] else {}
        t.add_row(str(s["depth"]), s["id"][:12], s["action"] or "(root)", e.get("status", "-"),
                  fmt_ms(e.get("median_ms")), fmt_x(e.get("speedup_eager")), fmt_x(e.get("speedup_compile")))
    console.print(t)


def print_eval(r: dict[str, Any]) -> None:
    colour = "green" if r["status"] == "correct" else "red"
    console.print(f"status: [bold {colour}]{r['status']}[/]")
    if r.get("error_text"):
        console.print(f"error: {r['error_text'][:2000]}")
    for key in ("max_abs_err", "max_rel_err"):
        if r.get(key) is not None:
            console.print(f"{key}: {r[key]:.3g}")
    if r.get("median_ms") is not None:
        console.print(f"candidate: {fmt_ms(r['median_ms'])} (p20 {fmt_ms(r.get('p20_ms'))}, p80 {fmt_ms(r.get('p80_ms'))})")
        console.print(f"eager:     {fmt_ms(r.get('eager_ms'))}   compile: {fmt_ms(r.get('compile_ms'))}")
    if r.get("interpreted"):
        console.print("timings are interpreted (Triton interpreter on CPU): no speedup is claimed")
    else:
        console.print(f"speedup vs eager {fmt_x(r.get('speedup_eager'))}, vs torch.compile {fmt_x(r.get('speedup_compile'))}")
    if r.get("own_kernel_share") is not None:
        console.print(f"own kernel share: {r['own_kernel_share']:.0%}" + (" (library only)" if r.get("library_only") else ""))
    console.print(f"device: {r.get('device')}")
    if (r.get("details") or {}).get("instance"):
        console.print(f"instance: {r['details']['instance']['text']}")
