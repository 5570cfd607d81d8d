"""A comparison's presentation: text, JSON and the HTML page with its plots."""

from __future__ import annotations

import io
import json
import re
from html import escape
from pathlib import Path
from typing import Any

from kernellab.compare.runs import REACH
from kernellab.fileio import write_atomic


def _f(v: float | None, fmt: str = ".3g") -> str:
    return "–" if v is None else format(v, fmt)


def _p(v: float | None) -> str:
    return "–" if v is None else (f"{v:.2g}" if v >= 0.001 else f"{v:.1e}")


def _ci(ci: list) -> str:
    return "–" if not ci or ci[0] is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def to_text(result: dict) -> str:
    """A terminal summary: strategies, then the paired comparisons."""
    lines = [f"compare ({result['by']}): {len(result['runs'])} runs; value: {result['value_label']}"]
    if result["interpreted"]:
        lines.append("interpreted (CPU) runs: no speedup is claimed")
    for s in result["strategies"]:
        lines.append(f"  {s['group']}: runs {s['runs']}, correct {s['correct_found']}, final median "
                     f"{_f(s['final_median'])}, AUC {_f(s['auc'])} {_ci(s['auc_ci']).replace('+', '')}, "
                     f"evals to {REACH:.0%} {_f(s['evaluations_to_95_median'])} ({s['reached_95']}/{s['runs']} reached), "
                     f"failures {s['failed']}/{s['evaluations']}")
    for p in result["pairs"]:
        if p["a"] < p["b"] and not p["called"]:
            lines.append(f"  {p['a']} vs {p['b']}: {p['pairs']} pairs, not called (interpreted timings)")
        elif p["a"] < p["b"]:
            lines.append(f"  {p['a']} vs {p['b']}: {p['wins']}/{p['ties']}/{p['losses']} (win/tie/loss of "
                         f"{p['pairs']} pairs), mean diff {_f(p['mean_diff'], '+.3f')} {_ci(p['ci'])}, "
                         f"Wilcoxon p {_p(p['wilcoxon_p'])}")
    if result.get("missing"):
        lines.append(f"  not run yet: {len(result['missing'])} (cell, problem) of the study")
    if result.get("unfinished"):
        lines.append(f"  unfinished, left out: {len(result['unfinished'])} runs")
    return "\n".join(lines)


_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf"]


def _svg(draw: Any, salt: str, size: tuple[float, float] = (6.6, 3.4)) -> str:
    """One matplotlib figure as inline SVG: text kept as text, no date, ids salted per figure so that
    several figures on one page never share an id."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"kernellab-{salt}", "font.size": 9,
                                "axes.spines.top": False, "axes.spines.right": False}):
        fig = Figure(figsize=size, layout="constrained")
        draw(fig.add_subplot())
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _curve_plot(result: dict, key: str, xlabel: str, ylabel: str, salt: str, unit: bool = False) -> str:
    colours = {g: _COLOURS[i % len(_COLOURS)] for i, g in enumerate(result["groups"])}

    def draw(ax: Any) -> None:
        import numpy as np

        for g in result["groups"]:
            c = result["curves"][g][key]
            x = np.array(c["x"], dtype=float)
            med = np.array([np.nan if v is None else v for v in c["median"]], dtype=float)
            lo = np.array([np.nan if v is None else v for v in c["p25"]], dtype=float)
            hi = np.array([np.nan if v is None else v for v in c["p75"]], dtype=float)
            if len(x) and key != "gpu_s":
                # a step drawn "post" gives the last value no width: hold it for half an evaluation
                x, med, lo, hi = (np.append(v, v[-1] if k else v[-1] + 0.5) for k, v in enumerate((x, med, lo, hi)))
            ax.step(x, med, where="post", color=colours[g], label=g, linewidth=1.6)
            ax.fill_between(x, lo, hi, step="post", color=colours[g], alpha=0.18, linewidth=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if unit:
            ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, frameon=False)

    return _svg(draw, salt)


def _failure_plot(result: dict) -> str:
    classes = sorted({k for s in result["strategies"] for k in s["failures"]})

    def draw(ax: Any) -> None:
        groups = [s["group"] for s in result["strategies"]]
        left = [0.0] * len(groups)
        for i, cls in enumerate(classes):
            vals = [s["failures"].get(cls, 0) / s["evaluations"] if s["evaluations"] else 0.0
                    for s in result["strategies"]]
            ax.barh(groups, vals, left=left, color=_COLOURS[i % len(_COLOURS)], label=cls)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        ax.set_xlabel("share of the strategy's evaluations (full) that failed, by class")
        ax.set_xlim(0, max([1e-9, *left]) * 1.1)
        ax.legend(fontsize=8, frameon=False)
        ax.grid(alpha=0.3, axis="x")

    return _svg(draw, "failures", size=(6.6, 0.6 + 0.45 * max(1, len(result["strategies"]))))


_CSS = """body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1100px;
padding:0 18px;color:#222}h1{font-size:22px}h2{font-size:18px;margin-top:30px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 7px;
text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.warn{background:#fff4e0;border-left:4px solid #f0a020;padding:6px 10px}svg{max-width:100%;height:auto}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:12px}
footer{margin:40px 0 20px;color:#777;font-size:12px}code{font-size:12px}"""
_HEAD_JS = ("window.__klErrors=[];window.addEventListener('error',function(e){"
            "window.__klErrors.push(String(e.message||e.type)+' '+(e.filename||'')+':'+(e.lineno||''));});")
_TAIL_JS = ("(function(){var d=document.getElementById('kl-errors');"
            "d.setAttribute('data-count',String(window.__klErrors.length));"
            "d.textContent=window.__klErrors.join('\\n');})();")
# the page's sections, in order; the browser test checks each holds a plot or a table
SECTIONS = ("summary", "curves", "strategies", "matrix", "llm", "failures", "runs", "method")


def _table(head: list[str], rows: list[list[Any]]) -> str:
    h = "".join(f"<th>{escape(str(c))}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def _rst(text: str) -> str:
    """The docstring's ``code`` and **bold** as HTML (escaped first)."""
    out = re.sub(r"``(.+?)``", r"<code>\1</code>", escape(text))
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)


def render_html(result: dict) -> str:
    from kernellab import __version__

    r = result
    title = f"study {r['study']}" if r.get("study") else f"{len(r['campaigns'])} campaigns"
    val = r["value_label"]
    sec: dict[str, str] = {}
    facts = [["database", r.get("database", "")], ["grouped by", r["by"]], ["groups", ", ".join(r["groups"])],
             ["runs (finished)", len(r["runs"])], ["value", val], ["evaluation horizon", r["horizon"]]]
    if r.get("suite"):
        facts[1:1] = [["suite", r["suite"]], ["problems", ", ".join(r.get("problems") or [])],
                      ["cells", r.get("cells")]]
    warn = ""
    if r["interpreted"]:
        warn += ("<p class=warn>Interpreted runs (no CUDA device): values are the interpreted eager/candidate "
                 "time ratio; <b>no speedup is claimed</b>, no pair is called a win or a loss, and LLM cost per "
                 "unit of gain is not computed.</p>")
    if len(r["objectives"]) > 1:
        warn += f"<p class=warn>The campaigns optimize different objectives: {', '.join(r['objectives'])}.</p>"
    if r.get("missing") or r.get("unfinished"):
        warn += (f"<p class=warn>Incomplete: {len(r.get('missing') or [])} (cell, problem) of the study not run "
                 f"yet, {len(r.get('unfinished') or [])} runs unfinished (left out). Pairs need both sides.</p>")
    sec["summary"] = warn + _table(["", ""], facts)
    sec["curves"] = "<div class=plots>" + "".join([
        _curve_plot(r, "evaluations", "evaluations spent", f"best so far: {val}", "evals"),
        _curve_plot(r, "gpu_s", r["time_label"], f"best so far: {val}", "time"),
        _curve_plot(r, "normalized", "evaluations spent", "best so far / best any run found on the problem",
                    "norm", unit=True),
    ]) + ("</div><p>Lines: median over the runs (problems × seeds) of each group; bands: 25th–75th percentile. "
          "The first two plots leave out runs with no counted correct candidate yet; the third counts them as 0.</p>")
    sec["strategies"] = _table(
        ["group", "runs", "problems", "seeds", "correct found", "final median", "final p25–p75",
         "final geomean", "final / best (mean)", "AUC (normalized)", "AUC 95% CI", f"evals to {REACH:.0%} (median)",
         f"{'s' if r['interpreted'] else 'GPU-s'} to {REACH:.0%} (median)", f"reached {REACH:.0%}",
         "evaluations", "GPU-s" if not r["interpreted"] else "eval s"],
        # the count, then which: a lone "0" read as no seed at all
        [[s["group"], s["runs"], s["problems"], f"{len(s['seeds'])} ({', '.join(map(str, s['seeds']))})",
          s["correct_found"],
          _f(s["final_median"]), f"{_f(s['final_p25'])}–{_f(s['final_p75'])}", _f(s["final_geomean"]),
          _f(s["final_normalized_mean"]), _f(s["auc"]), _ci(s["auc_ci"]).replace("+", ""),
          _f(s["evaluations_to_95_median"]), _f(s["gpu_s_to_95_median"]), f"{s['reached_95']}/{s['runs']}",
          s["evaluations_spent"], _f(s["gpu_s"], ".1f")] for s in r["strategies"]])
    groups = r["groups"]
    cell = {(p["a"], p["b"]): p for p in r["pairs"]}
    def wtl(p: dict) -> str:
        return f"{p['wins']}/{p['ties']}/{p['losses']}" if p["called"] else "not called (interpreted)"

    grid = [[a] + ["—" if a == b else wtl(cell[(a, b)]) for b in groups] for a in groups]
    detail = [[p["a"], p["b"], p["pairs"], p["problems"], wtl(p),
               _f(p["mean_diff"], "+.3f"), _ci(p["ci"]), _p(p["wilcoxon_p"]), _f(p["ratio_geomean"])]
              for p in r["pairs"] if p["a"] < p["b"]]
    sec["matrix"] = (f"<p>Row against column: wins/ties/losses over the (problem, seed) pairs both ran, on the "
                     f"normalized final value (tie: within {r['tie']:.0%}).</p>"
                     + _table(["row vs column"] + groups, grid)
                     + _table(["A", "B", "pairs", "problems", "W/T/L (A)", "mean diff A−B (normalized)",
                               "95% CI (bootstrap over problems)", "Wilcoxon p", "geomean final A/B"], detail))
    sec["llm"] = _table(
        ["group", "LLM calls", "input tokens", "output tokens", "dollars", "gain Σ max(0, final − 1)",
         "tokens per unit gain", "dollars per unit gain"],
        [[s["group"], _f(s["llm"]["calls"], ".4g"), _f(s["llm"]["input_tokens"], ".0f"),
          _f(s["llm"]["output_tokens"], ".0f"), _f(s["llm"]["usd"], ".4f"),
          "not claimed (interpreted)" if s["llm"]["gain"] is None else _f(s["llm"]["gain"]),
          _f(s["llm"]["tokens_per_gain"], ".4g"), _f(s["llm"]["usd_per_gain"], ".4g")] for s in r["strategies"]])
    plot = _failure_plot(r) if any(s["failures"] for s in r["strategies"]) else "<p>No failed evaluation.</p>"
    sec["failures"] = plot + _table(
        ["group", "evaluations (full)", "failed", "rate", "classes"],
        [[s["group"], s["evaluations"], s["failed"], _f(s["failure_rate"], ".2f"),
          ", ".join(f"{k} {v}" for k, v in s["failures"].items()) or "–"] for s in r["strategies"]])
    sec["runs"] = _table(
        ["campaign", "problem", "seed", "group", "evaluations", "GPU-s" if not r["interpreted"] else "eval s",
         "final", "re-timed", "final / best", "AUC", f"evals to {REACH:.0%}", "$"],
        [[p["campaign"], p["problem"], p["seed"], p["group"], p["evaluations_spent"], _f(p["gpu_s"], ".1f"),
          _f(p["final"]), "yes" if p["final_retimed"] else "no", _f(p["final_normalized"]), _f(p["auc"]),
          _f(p["evaluations_to_95"]), _f(p["usd"], ".4f")] for p in r["runs"]])
    method = (__doc__ or "").split("Definitions (the page's \"method\" section says the same):", 1)[-1]
    method = method.split("numpy, scipy and matplotlib", 1)[0].strip()
    items = [_rst(" ".join(x.split()).lstrip("- ")) for x in method.split("\n- ") if x.strip()]
    sec["method"] = "<ul>" + "".join(f"<li>{x}</li>" for x in items) + "</ul>" + (
        f"<p>Bootstrap: {r['bootstrap']} resamples, seed {r['seed']}.</p>")
    heads = {"summary": "Summary", "curves": "Best so far", "strategies": "Strategies",
             "matrix": "Win / tie / loss", "llm": "LLM tokens and dollars", "failures": "Failures",
             "runs": "Runs", "method": "Method"}
    body = "".join(f'<section data-section="{k}"><h2>{heads[k]}</h2>{sec[k]}</section>' for k in SECTIONS)
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>kernellab compare: {escape(title)}</title><style>{_CSS}</style><script>{_HEAD_JS}</script>"
            f"</head><body><h1>kernellab compare: {escape(title)}</h1>{body}"
            f"<footer>Generated by kernellab {escape(__version__)} on {escape(r.get('date', ''))} from the store "
            "alone; plots by matplotlib (SVG).</footer>"
            f'<div id="kl-errors" data-count="-1" hidden></div><script>{_TAIL_JS}</script></body></html>\n')


def write_html(result: dict, path: str | Path) -> Path:
    path = Path(path)
    write_atomic(path, render_html(result))
    return path


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2, default=str)
