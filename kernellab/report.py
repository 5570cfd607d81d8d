"""The HTML report of a campaign: one self-contained file computed only from the store.

The page needs no network (inline CSS, inline SVG plots from :mod:`kernellab._svg`, source
highlighted by pygments with inline styles) and holds, per problem: the best speedups vs eager and
vs torch.compile with their p20-p80 band, best-so-far against evaluations and against time, the
lineage of the best candidate with what the analyst said, the whole tree coloured by status, a
roofline against the measured ceilings, failures by class and the best source; then LLM usage.

Interpreted (CPU, Triton interpreter) timings are never shown as speedups: such a problem shows its
interpreted times and the number of correct candidates found instead.

Roofline metrics (``metrics`` rows of any evaluation of a candidate, summed over its kernels):
FLOPs from ``flop_count`` (or ``flops``), else from the sandbox's ncu counts
``2 * fp32_fma_thread_ops + fp32_add_thread_ops + fp32_mul_thread_ops`` (fp32 SASS only: tensor-core
work is not counted, and the page says so); DRAM bytes from ``dram_bytes`` (or ``dram__bytes.sum``,
or ``dram_bytes_read`` + ``dram_bytes_write``, or ncu's ``dram__bytes_read.sum`` +
``dram__bytes_write.sum``); time from ``duration_ms`` (or ``duration_ns`` / ncu's
``gpu__time_duration.sum`` in ns; else the candidate's median time). Where counts are missing, the
rates ``achieved_fp32_tflops`` / ``achieved_bandwidth_tbs`` times the duration stand in; a kernel
with rates ``achieved_flop_per_s`` and ``achieved_bytes_per_s`` but no duration is one point of
its own. With bytes and time but no FLOPs the section shows achieved bandwidth against the copy
ceiling; with none of these it says why (and the ``profile`` events' reasons, when recorded).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections import Counter, defaultdict
from html import escape
from pathlib import Path
from typing import Any

from . import _svg
from .vocab import DEFAULT_OBJECTIVE, JUDGED, Kind, Status, best_key, check_objective

__all__ = ["render", "write", "CEILINGS", "SECTIONS"]

# The measured ceilings of the reference GPU (H200, torch 2.11, one run each). bf16 was
# measured at 700-757 TFLOP/s over n = 4096-8192: the roof is drawn at the best measurement.
CEILINGS: dict[str, Any] = {
    "device": "the reference GPU, an H200 (torch 2.11, measured once each)",
    "copy_bytes_per_s": 4.22e12,
    "peaks": {"fp32 (cuBLAS)": 51e12, "tf32 (cuBLAS)": 355e12, "bf16 (cuBLAS)": 757e12},
}
_DTYPE_PEAK = {"float32": "fp32 (cuBLAS)", "bfloat16": "bf16 (cuBLAS)", "float16": "bf16 (cuBLAS)"}
# the per-problem sections, in page order; the browser test checks each is present
SECTIONS = ("speedups", "progress", "lineage", "tree", "roofline", "failures", "source")
_TIMED = JUDGED
_COUNTED = (Kind.FULL.value, Kind.TRIAL.value, Kind.RETIME.value)


# ------------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------------
def _claims(e: dict) -> bool:
    """An evaluation whose speedups may be reported: correct, fully timed, not interpreted."""
    return e["status"] == Status.CORRECT and e["kind"] in _TIMED and not e["interpreted"]


def _t(iso: str | None) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromisoformat(iso) if iso else None
    except ValueError:
        return None


def _cand_status(evs: list[dict]) -> str:
    for kinds in (_TIMED, ("trial",)):
        group = [e for e in evs if e["kind"] in kinds]
        if group:
            return "correct" if any(e["status"] == "correct" for e in group) else group[-1]["status"]
    return "pending"


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g} ms"


def _band(e: dict, base: str) -> str:
    """The speedup band implied by the candidate's p20/p80 times against the baseline's median."""
    b, p20, p80 = e.get(base), e.get("p20_ms"), e.get("p80_ms")
    if not (b and p20 and p80):
        return ""
    return f"p20–p80 {b / p80:.2f}–{b / p20:.2f}×"


def _verdict(e: dict, base: str) -> str:
    """Whether the reported number is a re-timing and whether its band clears the baseline's."""
    if not e.get("retimed"):
        return "not re-timed: the best of all evaluations, biased up by noise"
    win = e.get(f"win_{base}")
    if win is None:
        return "re-timed in a fresh job"
    return ("re-timed; band clears the baseline's (candidate p80 < baseline p20)" if win
            else "re-timed; band overlaps the baseline's: not counted as a win")


def _first(v: dict[str, float], *names: str) -> float | None:
    return next((v[n] for n in names if n in v), None)


def _kernel_counts(v: dict[str, float]) -> tuple[float | None, float | None, float | None, str]:
    """(FLOPs, DRAM bytes, ms, where the FLOPs came from) of one kernel's metrics."""
    flops, src = _first(v, "flop_count", "flops"), "reported"
    if flops is None and "fp32_fma_thread_ops" in v:
        # the sandbox's ncu counts: fp32 SASS instructions only (tensor-core work is not in them)
        flops = 2 * v["fp32_fma_thread_ops"] + v.get("fp32_add_thread_ops", 0.0) + v.get("fp32_mul_thread_ops", 0.0)
        src = "fp32 SASS"
    nbytes = _first(v, "dram_bytes", "dram__bytes.sum")
    for rd, wr in (("dram_bytes_read", "dram_bytes_write"), ("dram__bytes_read.sum", "dram__bytes_write.sum")):
        if nbytes is None and (rd in v or wr in v):
            nbytes = v.get(rd, 0.0) + v.get(wr, 0.0)
    ms = _first(v, "duration_ms")
    ns = _first(v, "duration_ns", "gpu__time_duration.sum")
    if ms is None and ns is not None:
        ms = ns / 1e6
    if ms:  # rates only (no counts): counts over the kernel's duration
        tflops = _first(v, "achieved_fp32_tflops")
        tbs = _first(v, "achieved_bandwidth_tbs")
        if flops is None and tflops is not None:
            flops, src = tflops * 1e12 * ms / 1e3, "fp32 SASS"
        if nbytes is None and tbs is not None:
            nbytes = tbs * 1e12 * ms / 1e3
    return flops, nbytes, ms, src


def _metric_point(ms: list[dict], fallback_ms: float | None) -> tuple[list[tuple], dict | None]:
    """Per-kernel rate points (kernels with rates but no duration), and the counts of one
    evaluation summed over its kernels (see the module docstring)."""
    per: dict[str, dict[str, float]] = defaultdict(dict)
    for m in ms:
        per[m["kernel"]][m["name"]] = m["value"]
    rate_pts, tot = [], {"flops": 0.0, "bytes": 0.0, "ms": 0.0, "kernels": [], "flop_src": set()}
    has = {"flops": False, "bytes": False, "ms": False}
    for kernel, v in per.items():
        flops, nbytes, dur, src = _kernel_counts(v)
        fr = _first(v, "achieved_flop_per_s")
        br = _first(v, "achieved_bytes_per_s", "dram_bytes_per_s")
        if dur is None and fr and br:
            rate_pts.append((kernel, fr / br, fr, br))
            continue
        for key, val in (("flops", flops), ("bytes", nbytes), ("ms", dur)):
            if val is not None:
                tot[key] += val
                has[key] = True
        if flops is not None:
            tot["flop_src"].add(src)
        if flops is not None or nbytes is not None:
            tot["kernels"].append(kernel)
    if not has["ms"] and fallback_ms:
        tot["ms"], has["ms"] = fallback_ms, True
    if not (has["bytes"] and has["ms"] and tot["ms"] > 0):
        return rate_pts, None
    tot["has_flops"] = has["flops"]
    return rate_pts, tot


def _problem_dtype(source: str) -> str:
    m = re.search(r"^DTYPE\s*=\s*['\"](\w+)['\"]", source or "", re.M)
    return m.group(1) if m else "float32"


def _settings_line(source: str) -> str:
    """The problem settings that change what was measured: dtype and mode (train: BatchNorm on batch
    statistics, dropout active, as KernelBench; eval: inference)."""
    from kernellab.problem import declared_mode

    return (f'<p class="settings" data-mode="{escape(declared_mode(source))}">dtype {escape(_problem_dtype(source))}'
            f' &middot; mode {escape(declared_mode(source))}</p>')


def _problem_data(store: Any, cid: str, pid: str, cands: list[dict], evals: list[dict],
                  analyses: dict[str, dict], objective: str) -> dict:
    prob = store.get_problem(pid) or {"name": pid, "source": ""}
    ids = {c["id"] for c in cands}
    evs = [e for e in evals if e["candidate_id"] in ids]
    by_cand: dict[str, list[dict]] = defaultdict(list)
    for e in evs:
        by_cand[e["candidate_id"]].append(e)
    timed = [e for e in evs if e["kind"] in _TIMED and e["median_ms"] is not None]
    # a problem is interpreted when every timing it has came from the interpreter
    interpreted = (bool(timed) and all(e["interpreted"] for e in timed)) or (
        not timed and any(e["interpreted"] for e in evs))
    # one winner per problem under the campaign's objective, with both its speedups from the same
    # (re-timing) job: the number status, export and bench print too
    best_e = best_c = (store.reported_best(cid, pid, objective) or [None])[0]
    return {"id": pid, "name": prob["name"], "source": prob.get("source") or "", "cands": cands,
            "cand_by_id": {c["id"]: c for c in cands}, "evals": evs, "by_cand": by_cand,
            "interpreted": interpreted, "best_e": best_e, "best_c": best_c, "analyses": analyses,
            "objective": objective}


# ------------------------------------------------------------------------------------------------
# sections
# ------------------------------------------------------------------------------------------------
def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _section(name: str, title: str, body: str, pid: str = "") -> str:
    anchor = f"{pid}-{name}" if pid else name
    return (f'<section id="{escape(anchor)}" data-section="{name}"><h3>{escape(title)}</h3>{body}</section>')


def _best_speedup(e: dict | None, key: str) -> float | None:
    return e[key] if e is not None and _claims(e) else None


def _sec_speedups(p: dict) -> str:
    if p["best_e"] is None:
        return '<p class="warn">No correct candidate for this problem.</p>'
    if p["interpreted"]:
        b = p["best_e"]
        return ('<p class="interp">Timings are <b>interpreted</b> (Triton interpreter on the CPU): '
                'correctness is real, times are not GPU times, and no speedup is claimed.</p>' +
                _table(["fastest correct candidate", "interpreted time (p20–p80)", "action", "timing"],
                       [[f"<code>{escape(b['candidate_id'][:12])}</code>",
                         f"{_ms(b['median_ms'])} ({_ms(b['p20_ms'])}–{_ms(b['p80_ms'])})",
                         escape(b["action"] or "(root)"),
                         "re-timed in a fresh job" if b.get("retimed") else "not re-timed"]]))
    rows = []
    for label, e, key, base in (("vs eager", p["best_e"], "speedup_eager", "eager_ms"),
                                ("vs torch.compile", p["best_c"], "speedup_compile", "compile_ms")):
        s = _best_speedup(e, key)
        note = [_verdict(e, base.removesuffix("_ms"))] + (["library only"] if e["library_only"] else [])
        rows.append([label, f'<b class="x">{_x(s)}</b>', escape(_band(e, base)) if s is not None else "",
                     f"<code>{escape(e['candidate_id'][:12])}</code>", _ms(e["median_ms"]), _ms(e.get(base)),
                     escape(json.dumps(e.get("config") or {})), escape("; ".join(note))])
    return _table(["best", "speedup", "band", "candidate", "time", "baseline", "config", "note"], rows)


def _sec_progress(p: dict, t0: _dt.datetime | None) -> str:
    counted = [e for e in p["evals"] if e["kind"] in _COUNTED]
    if not counted:
        return _svg.empty("no evaluations yet")
    times = [_t(e["created_at"]) for e in counted]
    t0 = t0 or min(t for t in times if t)
    secs = [((t - t0).total_seconds() if t and t0 else None) for t in times]
    unit, div = ("min", 60.0) if max(s or 0 for s in secs) > 600 else ("s", 1.0)
    if p["interpreted"]:
        specs = [("correct candidates (cumulative)", None)]
        y_label, hlines = "correct candidates", ()
    else:
        specs = [("best vs eager", "speedup_eager"), ("best vs torch.compile", "speedup_compile")]
        y_label, hlines = "best speedup so far (×)", ((1.0, "1× (baseline)"),)
    by_evals, by_time = [], []
    for k, (name, key) in enumerate(specs):
        se = _svg.Series(name, colour=_svg.PALETTE[k])
        st = _svg.Series(name, colour=_svg.PALETTE[k])
        best, seen = None, set()
        for i, (e, s) in enumerate(zip(counted, secs, strict=True), start=1):
            if key is None:
                val = None
                if e["status"] == "correct" and e["candidate_id"] not in seen:
                    seen.add(e["candidate_id"])
                    val = float(len(seen))
            else:
                v = e[key] if _claims(e) else None
                val = v if v is not None and (best is None or v > best) else None
            last = i == len(counted)
            if val is not None or (last and (best is not None)):
                best = val if val is not None else best
                cand = p["cand_by_id"].get(e["candidate_id"], {})
                tip = f"{name}: {best:.3g} after {i} evaluations — {e['candidate_id'][:12]} {cand.get('action') or ''}"
                se.points.append((float(i), best, tip))
                if s is not None:
                    st.points.append((s / div, best, tip))
        by_evals.append(se)
        by_time.append(st)
    return ('<div class="plots">' +
            _svg.line_chart(by_evals, x_label="evaluations (full, trial, retime)", y_label=y_label,
                            hlines=hlines, label=f"{p['name']} best so far vs evaluations") +
            _svg.line_chart(by_time, x_label=f"time since the campaign started ({unit})", y_label=y_label,
                            hlines=hlines, label=f"{p['name']} best so far vs time") + "</div>")


def _best_eval(p: dict, cid: str) -> dict | None:
    """A candidate's best timed evaluation under the report's objective (interpreted rows carry no
    speedup, so among them the fastest)."""
    evs = [e for e in p["by_cand"].get(cid, []) if e["status"] == Status.CORRECT and e["kind"] in _TIMED]
    return min(evs, key=best_key(p["objective"]), default=None)


def _sec_lineage(p: dict, store: Any) -> str:
    if p["best_e"] is None:
        return "<p>No correct candidate, so no lineage to show.</p>"
    rows = []
    chain = store.lineage(p["best_e"]["candidate_id"])
    # how far the winner moved from its seed (the root: builtin or inductor, torch.compile's own code)
    e0, e1 = _best_eval(p, chain[0]["id"]), p["best_e"]
    gain = (f", {e1['speedup_eager'] / e0['speedup_eager']:.2f}x the seed's speed" if e0 and not p["interpreted"]
            and e0.get("speedup_eager") and e1.get("speedup_eager") else "")
    moved = (f"<p>From the seed ({escape(chain[0]['origin'])}: {escape(chain[0]['action'] or 'root')}): "
             f"{len(chain) - 1} step(s){gain}.</p>")
    for c in chain:
        e = _best_eval(p, c["id"])
        status = _cand_status(p["by_cand"].get(c["id"], []))
        a = p["analyses"].get(c["id"])
        said = ""
        if a and a.get("error"):
            said = f"<i>the analyst failed: {escape(str(a['error']))}</i>"
        elif a:
            pct = a.get("pct_of_ceiling")
            said = (f"<b>{escape(str(a.get('bound') or '?'))}</b>"
                    + (f", {pct:.0f}% of ceiling" if isinstance(pct, (int, float)) else "")
                    + f": {escape(str(a.get('evidence') or ''))}")
            ideas = a.get("next_ideas") or []
            if ideas:
                said += "<br>next: " + escape("; ".join(map(str, ideas)))
        if e is None:
            speed = "–"
        elif p["interpreted"]:
            speed = f"{_ms(e['median_ms'])} (interpreted)"
        else:
            speed = f"{_x(e['speedup_eager'])} eager, {_x(e['speedup_compile'])} compile"
        rows.append([str(c["depth"]), f"<code>{escape(c['id'][:12])}</code>", escape(c["action"] or "(root)"),
                     escape(c["origin"] + (f" / {c['model']}" if c.get("model") else "")),
                     f'<span class="st st-{escape(status)}">{escape(status)}</span>', speed, said or "–"])
    return moved + _table(["depth", "candidate", "action", "origin", "status", "result", "analyst"], rows, "lineage")


def _sec_tree(p: dict, store: Any) -> str:
    best_path = set()
    if p["best_e"] is not None:
        best_path = {c["id"] for c in store.lineage(p["best_e"]["candidate_id"])}
    nodes, counts = [], Counter()
    for c in p["cands"]:
        status = _cand_status(p["by_cand"].get(c["id"], []))
        counts[status] += 1
        e = _best_eval(p, c["id"])
        vs = "eager" if p["objective"] == "speedup_eager" else "torch.compile"
        res = "" if e is None else (f", {_ms(e['median_ms'])} interpreted" if p["interpreted"]
                                    else f", {_x(e[p['objective']])} vs {vs}")
        nodes.append({"id": c["id"], "parent": c["parent_id"], "colour": _svg.STATUS_COLOURS.get(status, "#999"),
                      "highlight": c["id"] in best_path,
                      "title": f"{c['id'][:12]} depth {c['depth']}: {c['action'] or '(root)'} — {status}{res}"})
    legend = " ".join(f'<span class="st st-{escape(s)}">{escape(s)} {n}</span>' for s, n in sorted(counts.items()))
    return (f"<p>{len(nodes)} candidates; the best candidate's lineage is drawn thick. {legend}</p>"
            f'<div class="scroll">{_svg.tree(nodes, label=p["name"] + " tree")}</div>')


def _sec_roofline(p: dict, store: Any) -> str:
    bw, peaks = CEILINGS["copy_bytes_per_s"], CEILINGS["peaks"]
    peak_name = _DTYPE_PEAK.get(_problem_dtype(p["source"]), "fp32 (cuBLAS)")
    best_id = p["best_e"]["candidate_id"] if p["best_e"] else None
    pts, bw_rows, rows, sass_only = [], [], [], False
    for e in p["evals"]:
        ms = store.metrics(e["id"])
        if not ms:
            continue
        be = _best_eval(p, e["candidate_id"])
        rate_pts, tot = _metric_point(ms, be["median_ms"] if be else None)
        short = e["candidate_id"][:12]
        colour = "#d62728" if e["candidate_id"] == best_id else "#1f77b4"
        for kernel, ai, fr, _br in rate_pts:
            pts.append((ai, fr, f"{short} {kernel}: {ai:.3g} FLOP/B, {fr / 1e12:.3g} TFLOP/s", colour))
        if tot is None:
            continue
        tbps = tot["bytes"] / (tot["ms"] / 1e3)
        bw_rows.append((f"{short} ({e['kind']})", tbps / 1e12, colour))
        if tot["has_flops"] and tot["flops"] > 0 and tot["bytes"] > 0:
            ai, perf = tot["flops"] / tot["bytes"], tot["flops"] / (tot["ms"] / 1e3)
            roof = min(bw * ai, peaks[peak_name])
            pts.append((ai, perf, f"{short}: {ai:.3g} FLOP/B, {perf / 1e12:.3g} TFLOP/s", colour))
            sass_only |= "fp32 SASS" in tot["flop_src"]
            rows.append([f"<code>{escape(short)}</code>", escape(", ".join(tot["kernels"])[:80]),
                         f"{tot['flops']:.4g}", f"{tot['bytes']:.4g}", _ms(tot["ms"]), f"{ai:.3g}",
                         f"{perf / 1e12:.3g}", f"{tbps / 1e12:.3g}", f"{100 * perf / roof:.0f}%"])
    ceil = (f"<p>Ceilings: copy {bw / 1e12:.2f} TB/s; " + "; ".join(f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in peaks.items())
            + f" — {escape(CEILINGS['device'])}. The % column is against the {escape(peak_name)} roof.</p>")
    if sass_only:
        ceil += ("<p>FLOPs are counted from fp32 SASS instructions (2·FFMA + FADD + FMUL): tensor-core "
                 "work is not counted, so a kernel on tensor cores sits lower than it runs.</p>")
    if pts:
        return (_svg.roofline(pts, bandwidth=bw, peaks=[(v, k) for k, v in peaks.items()],
                              label=f"{p['name']} roofline") + ceil +
                (_table(["candidate", "kernels", "FLOPs", "DRAM bytes", "time", "FLOP/byte", "TFLOP/s", "TB/s",
                         "% of roof"], rows) if rows else ""))
    if bw_rows:
        return (_svg.bar_chart(bw_rows, x_label="achieved DRAM bandwidth (TB/s)", ref=(bw / 1e12, "copy ceiling"),
                               label=f"{p['name']} bandwidth") +
                "<p>No FLOP counts in the metrics: bandwidth against the copy ceiling only.</p>" + ceil)
    why = "interpreted campaign: profiling needs a GPU" if p["interpreted"] else \
        "no roofline metrics recorded (ncu missing, not permitted, or no candidate profiled)"
    skipped = sorted({s for s in p.get("profile_skips", []) if s})
    said = "".join(f"<li>{escape(str(s))}</li>" for s in skipped)
    # an interpreted (CPU) campaign ran on no GPU at all: a GPU's ceilings would say nothing true about it
    return (_svg.empty(f"no roofline: {why}") + (f"<p>The profiler said:</p><ul>{said}</ul>" if said else "")
            + ("" if p["interpreted"] else ceil))


def _sec_failures(p: dict) -> str:
    counted = [e for e in p["evals"] if e["kind"] in _COUNTED]
    bad = [e for e in counted if e["status"] != "correct"]
    if not counted:
        return "<p>No evaluations yet.</p>"
    by_status = Counter(e["status"] for e in bad)
    head = f"<p>{len(bad)} of {len(counted)} evaluations failed.</p>"
    if not bad:
        return head
    chart = _svg.bar_chart([(s, float(n), _svg.STATUS_COLOURS.get(s, "#999")) for s, n in by_status.most_common()],
                           x_label="evaluations", label=f"{p['name']} failures")
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for e in bad:
        groups[(e["status"], e.get("error_class") or "")].append(e)
    rows = []
    for (status, klass), es in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        first = next((e["error_text"] for e in es if e["error_text"]), "") or ""
        line = first.strip().splitlines()[-1] if first.strip() else ""
        rows.append([f'<span class="st st-{escape(status)}">{escape(status)}</span>', escape(klass or "–"),
                     str(len(es)), f"<code>{escape(line[:200])}</code>"])
    return head + chart + _table(["status", "class", "count", "example (last line)"], rows)


def _sec_source(p: dict) -> str:
    if p["best_e"] is None:
        return "<p>No correct candidate.</p>"
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    cand = p["cand_by_id"].get(p["best_e"]["candidate_id"]) or {}
    html = highlight(cand.get("source") or "", PythonLexer(), HtmlFormatter(noclasses=True, nobackground=False))
    cfg = escape(json.dumps(p["best_e"].get("config") or {}, sort_keys=True))
    return (f"<p>Candidate <code>{escape(cand.get('id', '')[:12])}</code> ({escape(cand.get('language') or '')}),"
            f" tuned CONFIG <code>{cfg}</code>.</p><div class='src'>{html}</div>")


def _sec_llm(calls: list[dict]) -> str:
    if not calls:
        return "<p>No LLM calls: this campaign used the builtin (offline) agents.</p>"
    g: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for c in calls:
        g[(c.get("role") or "?", c.get("model") or "?")].append(c)
    num = lambda cs, k: sum((c.get(k) or 0) for c in cs)
    rows = []
    for (role, model), cs in sorted(g.items()) + [(("total", ""), calls)]:
        lat = [c["latency_s"] for c in cs if c.get("latency_s") is not None]
        rows.append([escape(role), escape(model), str(len(cs)), f"{num(cs, 'input_tokens'):,}",
                     f"{num(cs, 'output_tokens'):,}", f"{num(cs, 'cache_read_tokens'):,}",
                     f"${num(cs, 'cost_usd'):.4f}", f"{sum(lat) / len(lat):.2f} s" if lat else "–"])
    return _table(["role", "model", "calls", "input tokens", "output tokens", "cache read", "cost", "mean latency"],
                  rows)


# ------------------------------------------------------------------------------------------------
# page
# ------------------------------------------------------------------------------------------------
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1180px;padding:0 18px;color:#222}
h1{margin:18px 0 4px}h2{border-bottom:2px solid #333;margin-top:34px}h3{margin:22px 0 6px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 7px;vertical-align:top;text-align:left}
th{background:#f3f3f3}code{font:12px ui-monospace,Menlo,monospace}.x{font-size:1.1em}
.interp{background:#fff6d6;border:1px solid #e5c35c;padding:6px 10px}.warn{color:#a00}
.plots{display:flex;flex-wrap:wrap;gap:12px}.scroll{overflow-x:auto;border:1px solid #eee}
.src{overflow-x:auto;border:1px solid #ddd;font-size:12px}nav a{margin-right:10px}
.st{display:inline-block;padding:0 5px;border-radius:3px;color:#fff;font-size:12px}
.facts td:first-child{font-weight:600}footer{margin:40px 0 20px;color:#777;font-size:12px}
"""
# Errors while the page loads are written into #kl-errors so that a headless browser test can read them.
_HEAD_JS = ("window.__klErrors=[];window.addEventListener('error',function(e){"
            "window.__klErrors.push(String(e.message||e.type)+' '+(e.filename||'')+':'+(e.lineno||''));});")
_TAIL_JS = ("(function(){var d=document.getElementById('kl-errors');"
            "d.setAttribute('data-count',String(window.__klErrors.length));"
            "d.textContent=window.__klErrors.join('\\n');})();")


def _status_css() -> str:
    css = "".join(f".st-{s}{{background:{c}}}" for s, c in _svg.STATUS_COLOURS.items())
    return css + ".st-pending{color:#222}"


def render(store: Any, campaign_id: str, objective: str | None = None) -> str:
    """The report of one campaign (id, id prefix or name) as one HTML document; the best candidates
    are chosen under ``objective`` (default: the campaign's)."""
    from kernellab.store import StoreError

    camp = store.get_campaign(campaign_id)
    if camp is None:
        raise StoreError(f"no campaign {campaign_id!r} in {store.path}")
    objective = objective or (camp.get("config") or {}).get("objective") or DEFAULT_OBJECTIVE
    try:
        check_objective(objective)
    except ValueError as exc:
        raise StoreError(str(exc)) from None
    cid = camp["id"]
    cands, evals = store.candidates(cid), store.evaluations(campaign_id=cid)
    probs = _problems(store, cid, cands, evals, objective)
    t0 = _t(camp["created_at"])
    interp_all = bool(probs) and all(p["interpreted"] for p in probs)

    parts = [f"<h1>kernellab report: {escape(camp['name'])}</h1>"]
    if interp_all:
        parts.append('<p class="interp" id="interpreted-note">This campaign ran on the CPU in the Triton interpreter: '
                     "every timing is <b>interpreted</b>, and no speedup is shown.</p>")
    nav = "".join(f'<a href="#p-{escape(p["id"])}">{escape(p["name"])}</a>' for p in probs)
    parts.append(f'<nav><a href="#summary">summary</a>{nav}<a href="#llm">LLM usage</a></nav>')
    parts.append(_table(["", ""], _facts(camp, cands, evals), "facts").replace("<thead><tr><th></th><th></th></tr></thead>", ""))
    parts.append(_section("summary", "Summary", _table(
        ["problem", "candidates", "correct", "evaluations", "best vs eager", "best vs torch.compile"],
        [_summary_row(p) for p in probs])))
    if not probs:
        parts.append("<p>This campaign has no candidates yet.</p>")
    parts += [_article(p, store, t0) for p in probs]
    parts.append(_section("llm", "LLM usage and cost", _sec_llm(store.llm_calls(cid))))
    from kernellab import __version__

    parts.append(f"<footer>Generated by kernellab {escape(__version__)} from the store alone; "
                 f"every number above is read from the database.</footer>")
    parts.append('<div id="kl-errors" data-count="-1" hidden></div>')
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>kernellab report: {escape(camp['name'])}</title><style>{_CSS}{_status_css()}</style>"
            f"<script>{_HEAD_JS}</script></head><body data-campaign=\"{escape(cid)}\">"
            + "".join(parts) + f"<script>{_TAIL_JS}</script></body></html>\n")


def _problems(store: Any, cid: str, cands: list[dict], evals: list[dict], objective: str) -> list[dict]:
    """Each problem's data (``_problem_data``), in the order of its first candidate, with its latest
    analyses and the reasons its profiles were skipped."""
    analyses: dict[str, dict] = {}
    for ev in store.events(cid, kind="analyze"):
        payload = ev.get("payload") or {}
        if payload.get("candidate_id"):
            analyses[payload["candidate_id"]] = payload  # the latest analysis of a candidate wins
    order: list[str] = []
    by_prob: dict[str, list[dict]] = defaultdict(list)
    for c in cands:
        if c["problem_id"] not in by_prob:
            order.append(c["problem_id"])
        by_prob[c["problem_id"]].append(c)
    probs = [_problem_data(store, cid, pid, by_prob[pid], evals, analyses, objective) for pid in order]
    skips = {(ev.get("payload") or {}).get("candidate_id"): (ev.get("payload") or {}).get("skipped")
             for ev in store.events(cid, kind="profile")}
    for p in probs:
        p["profile_skips"] = [skips[c["id"]] for c in p["cands"] if c["id"] in skips]
    return probs


def _facts(camp: dict, cands: list[dict], evals: list[dict]) -> list[list[str]]:
    return [["campaign", f"{escape(camp['name'])} (<code>{escape(camp['id'])}</code>)"], ["status", escape(camp["status"])],
            ["device", escape(camp["device"] or "–")], ["started", escape(camp["created_at"][:19])],
            ["last update", escape((camp.get("updated_at") or "")[:19])],
            ["versions", f"<code>{escape(json.dumps(camp.get('versions') or {}, sort_keys=True))}</code>"],
            ["config", f"<code>{escape(json.dumps(camp.get('config') or {}, sort_keys=True))}</code>"],
            ["store", f"{len(cands)} candidates, {len(evals)} evaluations"]]


def _summary_row(p: dict) -> list[str]:
    n_ok = sum(1 for c in p["cands"] if _cand_status(p["by_cand"].get(c["id"], [])) == "correct")
    if p["interpreted"]:
        se = sc = "interpreted: no speedup claimed"
    else:
        se = f"{_x(_best_speedup(p['best_e'], 'speedup_eager'))} " + (escape(_band(p['best_e'], 'eager_ms')) if p['best_e'] else "")
        sc = f"{_x(_best_speedup(p['best_c'], 'speedup_compile'))} " + (escape(_band(p['best_c'], 'compile_ms')) if p['best_c'] else "")
    return [f'<a href="#p-{escape(p["id"])}">{escape(p["name"])}</a>', str(len(p["cands"])),
            str(n_ok), str(len([e for e in p["evals"] if e["kind"] in _COUNTED])), se, sc]


def _article(p: dict, store: Any, t0: Any) -> str:
    """One problem's part of the report."""
    pid = f"p-{p['id']}"
    body = [_section("speedups", "Best speedups", _sec_speedups(p), pid),
            _section("progress", "Best so far", _sec_progress(p, t0), pid),
            _section("lineage", "Lineage of the best candidate", _sec_lineage(p, store), pid),
            _section("tree", "The tree, coloured by status", _sec_tree(p, store), pid),
            _section("roofline", "Roofline", _sec_roofline(p, store), pid),
            _section("failures", "Failures by class", _sec_failures(p), pid),
            _section("source", "Best source", _sec_source(p), pid)]
    return (f'<article class="problem" id="{escape(pid)}" data-problem="{escape(p["name"])}">'
            f'<h2>{escape(p["name"])}</h2>{_settings_line(p["source"])}{_instance_line(p["evals"])}'
            f'{"".join(body)}</article>')


def _instance_line(evals: list[dict]) -> str:
    """The sizes the candidates were judged at (a wrong small instance is seen at once)."""
    from kernellab.small import recorded_instances

    texts = recorded_instances(evals)
    return f'<p class="instance">{escape("; ".join(texts))}</p>' if texts else ""


def write(store: Any, campaign_id: str, path: str | Path, objective: str | None = None) -> Path:
    """Render the report and write it to ``path`` atomically (a reader never sees half a file, and
    a failed render leaves an earlier report intact); returns the path."""
    from kernellab.fileio import write_atomic

    return write_atomic(path, render(store, campaign_id, objective))
