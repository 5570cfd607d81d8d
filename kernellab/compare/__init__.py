"""``kernellab compare``: search strategies set against each other, with statistics, from the store alone.

Input: a study (``--study NAME``: the matrix ``kernellab study`` recorded) or a list of campaigns. A *run*
is one (campaign, problem); runs are grouped by strategy (policy, agents and prompt version: only the
parts that differ name a group), or ``--by policy|agents|prompts`` (an A/B of prompt and skill versions
groups by their content hash, over the same problems and seeds).

Definitions (the page's "method" section says the same):

- **best so far** after n evaluations: the best objective value among the run's counted evaluations so
  far: correct, kind ``full`` or a tuner ``retime``, a kernel win as bench counts one
  (``kernellab.bench._counts``: not library-only, own-kernel share >= 0.5 on a GPU). Every evaluation
  the search spent (``trial`` rows included) advances n; winners' fresh-job re-timings do not (they
  check the selection). GPU-seconds are the sandbox's ``details.gpu_s``, summed.
- **objective**: the campaign's speedup (vs eager or torch.compile). Interpreted (CPU) runs have no
  speedup: their value is ``eager_ms / median_ms`` in the interpreter (curves and finals alike), labelled
  as such, and nothing on the page calls it a speedup; their pairs are not called wins or losses
  (interpreter timings are noise for that).
- **final**: the run's reported best (``store.reported_best``: the winner's fresh-job re-timing), when
  it counts as a kernel win; else the last best-so-far value.
- **normalized**: a value divided by the best any run of the comparison reached on that problem
  (finals by finals, curves by curves), so problems of different scale pool; 0 before the first
  counted correct candidate. **AUC**: the mean of the normalized best-so-far over evaluations
  1..H (H: the most evaluations any run made; a run that stopped early keeps its last value).
- **evaluations to 95%**: the first n at which the run's best so far reaches 95% of the best any run
  reached on that problem.
- **paired comparison** of A and B: pairs are (problem, seed) present in both; a pair is a tie when
  the normalized finals differ by at most ``tie`` (relative). The effect is the mean paired difference
  of normalized finals, with a percentile bootstrap interval that resamples *problems* (a problem's
  seeds stay together: they are not independent); the p-value is Wilcoxon's signed-rank test over the
  pairs (scipy), which treats the pairs as independent.
- **LLM cost per unit of gain**: the runs' tokens and dollars (``llm_calls``; a replayed call counts what
  the original cost) over the summed gain ``max(0, final - 1)``; never computed for interpreted runs.
- **failures**: the ``full`` evaluations that were not correct, by error class (else status).

numpy, scipy and matplotlib are imported inside the functions that use them.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from kernellab.bench import _counts
from kernellab.fileio import write_atomic

__all__ = ["CompareError", "Run", "collect", "analyze", "compare", "render_html", "write_html", "to_text", "GROUPINGS"]

GROUPINGS = ("strategy", "policy", "agents", "prompts")
OBJECTIVE_LABELS = {"speedup_eager": "speedup vs eager", "speedup_compile": "speedup vs torch.compile"}
INTERPRETED_LABEL = "interpreted eager/candidate time ratio (Triton interpreter, CPU; not a speedup)"
REACH = 0.95
_COUNTED = ("full", "trial", "retime")


class CompareError(ValueError):
    """Nothing to compare, or bad input (an unknown study or campaign): one line, exit 2."""


@dataclass
class Run:
    """One (campaign, problem): its search trace and what it cost."""

    campaign_id: str
    campaign: str
    problem_id: str
    problem: str
    seed: int
    policy: str
    agents: str
    prompts: str | None
    objective: str
    finished: bool
    interpreted: bool = False
    # (evaluations so far, evaluation seconds so far, best so far or None)
    points: list[tuple[int, float, float | None]] = field(default_factory=list)
    final: float | None = None
    final_retimed: bool = False
    llm_calls: float = 0.0  # fractional where a multi-problem campaign's plan calls are shared
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    usd: float = 0.0
    evaluations: int = 0  # full evaluations (one per candidate evaluated)
    failures: dict[str, int] = field(default_factory=dict)
    group: str = ""

    @property
    def best(self) -> float | None:
        return self.points[-1][2] if self.points else None

    @property
    def gpu_s(self) -> float:
        return self.points[-1][1] if self.points else 0.0


# ------------------------------------------------------------------------------------------------
# reading the store
# ------------------------------------------------------------------------------------------------
def _value(e: dict, objective: str) -> float | None:
    """The objective, or on the interpreter the interpreted eager/candidate time ratio
    (:func:`interpreted_ratio`); a GPU evaluation without the objective (no torch.compile timing) has no
    value, never the eager ratio in its place."""
    from kernellab.search import score_of

    if e.get("interpreted"):
        return interpreted_ratio(e)
    value, surrogate = score_of(e, objective)
    return None if surrogate else value


def interpreted_ratio(e: dict) -> float | None:
    """``eager_ms / median_ms`` of a correct interpreted evaluation: the one value the page plots and
    reports for it, curves and finals alike. Not the search's score, which prefers the cost model's
    H200 estimate where one was recorded: a winner's re-timing has none, so its final (0.24) and the
    curve (2.8-3.6 from the estimate) disagreed under one label."""
    eager, ms = e.get("eager_ms"), e.get("median_ms")
    return float(eager) / float(ms) if e.get("status") == "correct" and eager and ms else None


def _prompts_of(camp: dict, calls: list[dict]) -> str | None:
    """The content hash of the prompts a campaign used: as recorded when it started (``config.prompts``,
    or its study's), else from the versions its LLM calls carry (``<role>-<hash>``; campaigns from before
    the hash was recorded), else None (builtin agents read no prompt)."""
    from kernellab.problem import content_hash

    recorded = (camp["config"].get("study") or {}).get("prompts") or camp["config"].get("prompts")
    if recorded:
        return recorded
    versions = sorted({c["prompt_version"] for c in calls if c.get("prompt_version")})
    return content_hash(*versions, n=12) if versions else None


def _run(store: Any, camp: dict, pid: str, calls: list[dict], n_problems: int) -> Run:
    from kernellab.store import is_winner_retime

    cfg = camp["config"]
    objective = cfg.get("objective") or "speedup_eager"
    prob = store.get_problem(pid) or {"name": pid[:10]}
    cands = {c["id"] for c in store.candidates(camp["id"], pid)}
    run = Run(campaign_id=camp["id"], campaign=camp["name"], problem_id=pid, problem=prob["name"],
              seed=int(cfg.get("seed") or 0), policy=str(cfg.get("policy") or "greedy"),
              agents=str(cfg.get("llm") or "builtin"), prompts=_prompts_of(camp, calls), objective=objective,
              finished=camp["status"] == "done")
    n, t, best = 0, 0.0, None
    failures: Counter = Counter()
    for e in store.evaluations(campaign_id=camp["id"]):
        if e["candidate_id"] not in cands or e["kind"] not in _COUNTED or is_winner_retime(e):
            continue
        n += 1
        t += float((e.get("details") or {}).get("gpu_s") or 0.0)
        run.interpreted = run.interpreted or bool(e["interpreted"])
        if e["kind"] == "full":
            run.evaluations += 1
            if e["status"] != "correct":
                failures[e.get("error_class") or e["status"]] += 1
        if e["kind"] in ("full", "retime") and e["status"] == "correct" and _counts(e, False):
            v = _value(e, objective)
            if v is not None and (best is None or v > best):
                best = v
        run.points.append((n, t, best))
    run.failures = dict(failures)
    reported = store.reported_best(camp["id"], pid, objective, library=False)
    if reported and _counts(reported[0], False) and _value(reported[0], objective) is not None:
        run.final, run.final_retimed = _value(reported[0], objective), bool(reported[0].get("retimed"))
    else:
        run.final = best
    # LLM calls: a one-problem campaign's are all the problem's; otherwise by candidate, and calls not
    # tied to a candidate (plans) shared evenly among the campaign's problems
    mine = [c for c in calls if n_problems == 1 or c.get("candidate_id") in cands]
    share = [] if n_problems == 1 else [c for c in calls if not c.get("candidate_id")]
    for group, w in ((mine, 1.0), (share, 1.0 / max(1, n_problems))):
        for c in group:
            run.llm_calls += w
            run.input_tokens += w * int(c.get("input_tokens") or 0)
            run.output_tokens += w * int(c.get("output_tokens") or 0)
            run.usd += w * float(c.get("cost_usd") or (c.get("response") or {}).get("replayed_cost_usd") or 0.0)
    return run


def collect(store: Any, *, study: str | None = None, campaigns: tuple[str, ...] | list[str] = ()) -> tuple[list[Run], dict]:
    """The runs of a study (its recorded matrix) or of the given campaigns, and what was left out."""
    if bool(study) == bool(campaigns):
        raise CompareError("give --study NAME or one or more CAMPAIGNs (not both)")
    chosen: list[tuple[dict, list[str]]] = []
    meta: dict[str, Any] = {"study": study, "missing": [], "unfinished": []}
    if study:
        from kernellab.study import cell_campaigns

        row = store.get_study(study)
        if row is None:
            known = ", ".join(s["name"] for s in store.list_studies()) or "none"
            raise CompareError(f"no study {study!r} in {store.path} (studies: {known})")
        cfg = row["config"]
        meta.update(suite=cfg["suite"], shared=cfg.get("shared"), cells=len(cfg["cells"]),
                    problems=[p["name"] for p in cfg["problems"]])
        pids = [p["id"] for p in cfg["problems"]]
        names = {p["id"]: p["name"] for p in cfg["problems"]}
        for entry in cfg["cells"]:
            camps = cell_campaigns(store, entry, pids)
            for pid in pids:
                if pid not in camps:
                    meta["missing"].append({"cell": entry["key"], "problem": names[pid]})
                else:
                    chosen.append((camps[pid], [pid]))
    else:
        for ref in campaigns:
            camp = store.get_campaign(ref)
            if camp is None:
                raise CompareError(f"no campaign {ref!r} in {store.path}")
            chosen.append((camp, list(camp["config"].get("problem_ids") or [])))
    runs = []
    for camp, pids in chosen:
        calls = store.llm_calls(camp["id"])
        n_problems = len(camp["config"].get("problem_ids") or pids)
        for pid in pids:
            run = _run(store, camp, pid, calls, n_problems)
            if not run.finished:
                meta["unfinished"].append({"campaign": camp["name"], "problem": run.problem, "status": camp["status"]})
            runs.append(run)
    return runs, meta


# ------------------------------------------------------------------------------------------------
# statistics
# ------------------------------------------------------------------------------------------------
def _label_groups(runs: list[Run], by: str) -> None:
    if by not in GROUPINGS:
        raise CompareError(f"--by {by!r}: one of {', '.join(GROUPINGS)}")

    def prompts(r: Run) -> str:
        return f"prompts {r.prompts}" if r.prompts else ("no prompts" if r.agents == "builtin"
                                                          else "prompts unknown")

    parts = {"policy": lambda r: r.policy, "agents": lambda r: r.agents, "prompts": prompts}
    if by != "strategy":
        for r in runs:
            r.group = parts[by](r)
        return
    varying = [k for k in ("policy", "agents", "prompts") if len({parts[k](r) for r in runs}) > 1] or ["policy"]
    for r in runs:
        r.group = " · ".join(parts[k](r) for k in varying)


def _norm(v: float | None, best: float | None) -> float:
    return v / best if v is not None and best else 0.0


def _at(points: list[tuple[int, float, float | None]], x: float, axis: int) -> float | None:
    """The best-so-far value once ``x`` evaluations (axis 0) or seconds (axis 1) were spent."""
    val = None
    for p in points:
        if p[axis] > x + 1e-12:
            break
        val = p[2]
    return val


def _pct(vals: list[float], q: float) -> float | None:
    import numpy as np

    return float(np.percentile(vals, q)) if vals else None


def _cluster_boot(values: dict[str, list[float]], n_boot: int, seed: int, level: float = 0.95
                  ) -> tuple[float | None, float | None, float | None]:
    """(mean, low, high): the mean over all values, with a percentile bootstrap interval that resamples
    the clusters (problems) with replacement, each with all of its values."""
    import numpy as np

    keys = [k for k in sorted(values) if values[k]]
    if not keys:
        return None, None, None
    sums = np.array([sum(values[k]) for k in keys], dtype=float)
    counts = np.array([len(values[k]) for k in keys], dtype=float)
    mean = float(sums.sum() / counts.sum())
    if len(keys) < 2 or n_boot <= 0:
        return mean, None, None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(keys), size=(n_boot, len(keys)))
    boots = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    a = (1 - level) / 2
    return mean, float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a))


def _wilcoxon(diffs: list[float]) -> float | None:
    """Two-sided Wilcoxon signed-rank p-value over paired differences (zeros dropped); 1.0 when every
    pair is equal, None without pairs."""
    import warnings

    from scipy import stats

    if not diffs:
        return None
    if all(abs(d) < 1e-12 for d in diffs):
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.wilcoxon(diffs, zero_method="wilcox", alternative="two-sided").pvalue)


def _geomean(vals: list[float]) -> float | None:
    vals = [v for v in vals if v and v > 0]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def analyze(runs: list[Run], *, by: str = "strategy", tie: float = 0.01, n_boot: int = 10_000, seed: int = 0,
            grid: int = 60) -> dict:
    """Everything the page and ``--json`` show, from finished runs (see the module's docstring)."""
    runs = [r for r in runs if r.finished]
    if not runs:
        raise CompareError("no finished campaign to compare")
    _label_groups(runs, by)
    interpreted = any(r.interpreted for r in runs)
    objectives = sorted({r.objective for r in runs})
    groups = sorted({r.group for r in runs})
    best_curve: dict[str, float | None] = {}
    best_final: dict[str, float | None] = {}
    for r in runs:
        if r.best is not None:
            best_curve[r.problem_id] = max(best_curve.get(r.problem_id) or 0.0, r.best)
        if r.final is not None:
            best_final[r.problem_id] = max(best_final.get(r.problem_id) or 0.0, r.final)
    horizon = max(len(r.points) for r in runs)
    max_s = max(r.gpu_s for r in runs)
    xs_n = list(range(1, horizon + 1))
    # 5% past the last evaluation, so that the value every run ends with is drawn with some width
    xs_t = [1.05 * max_s * i / (grid - 1) for i in range(grid)] if max_s > 0 else [0.0]
    per_run = [_run_row(r, best_curve.get(r.problem_id), best_final.get(r.problem_id), xs_n) for r in runs]
    strategies, curves = [], {}
    for g in groups:
        mine = [p for p in per_run if p["group"] == g]
        curves[g] = {"evaluations": _band([[_at(p["points"], x, 0) for x in xs_n] for p in mine], xs_n),
                     "gpu_s": _band([[_at(p["points"], x, 1) for x in xs_t] for p in mine], xs_t),
                     "normalized": _band([[float(v) for v in p["_norm_curve"]] for p in mine], xs_n)}
        strategies.append(_strategy_row(g, mine, interpreted, n_boot, seed))
    pairs = [_pair_row(a, b, per_run, tie, n_boot, seed, called=not interpreted)
             for a in groups for b in groups if a != b]
    for p in per_run:
        p.pop("_norm_curve")
    label = INTERPRETED_LABEL if interpreted else " / ".join(OBJECTIVE_LABELS.get(o, o) for o in objectives)
    return {"by": by, "groups": groups, "interpreted": interpreted, "objectives": objectives, "value_label": label,
            "time_label": ("evaluation seconds (Triton interpreter on the CPU)" if interpreted
                           else "GPU-seconds (summed evaluation device time)"),
            "tie": tie, "bootstrap": n_boot, "seed": seed, "reach": REACH, "horizon": horizon,
            "strategies": strategies, "pairs": pairs, "curves": curves, "runs": per_run,
            "best_by_problem": {"curve": best_curve, "final": best_final}}


def _run_row(r: Run, ref: float | None, best_final: float | None, xs_n: list[int]) -> dict:
    """One run's row: its figures, its curve normalized by the best any run of its problem reached (``ref``)
    and the evaluations and GPU-seconds it took to reach REACH of that."""
    import numpy as np

    norm_curve = [_norm(_at(r.points, x, 0), ref) for x in xs_n]
    reach = next((p for p in r.points if ref and p[2] is not None and p[2] >= REACH * ref), None)
    return {"campaign": r.campaign, "campaign_id": r.campaign_id, "problem": r.problem, "problem_id": r.problem_id,
            "seed": r.seed, "group": r.group, "policy": r.policy, "agents": r.agents, "prompts": r.prompts,
            "interpreted": r.interpreted, "objective": r.objective, "evaluations": r.evaluations,
            "evaluations_spent": len(r.points), "gpu_s": r.gpu_s, "best": r.best, "final": r.final,
            "final_retimed": r.final_retimed, "final_normalized": _norm(r.final, best_final),
            "auc": float(np.mean(norm_curve)) if norm_curve else 0.0,
            "evaluations_to_95": reach[0] if reach else None, "gpu_s_to_95": reach[1] if reach else None,
            "llm_calls": r.llm_calls, "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
            "usd": r.usd, "failures": r.failures, "points": r.points, "_norm_curve": norm_curve}


def _band(rows: list[list[float | None]], xs: list) -> dict:
    """Median and 25-75% band of the rows' values at each x (a row's None: no value there yet)."""
    out: dict[str, list] = {"x": list(xs), "median": [], "p25": [], "p75": [], "n": []}
    for j in range(len(xs)):
        col = [row[j] for row in rows if row[j] is not None]
        out["median"].append(_pct(col, 50))
        out["p25"].append(_pct(col, 25))
        out["p75"].append(_pct(col, 75))
        out["n"].append(len(col))
    return out


def _strategy_row(g: str, mine: list[dict], interpreted: bool, n_boot: int, seed: int) -> dict:
    """One group's summary over its runs: finals, area under the curve (bootstrapped over problems), reach,
    spending, LLM cost per unit of gain, failures."""
    import numpy as np

    by_problem: dict[str, list[float]] = defaultdict(list)
    for p in mine:
        by_problem[p["problem_id"]].append(p["auc"])
    auc, auc_lo, auc_hi = _cluster_boot(by_problem, n_boot, seed)
    finals = [p["final"] for p in mine if p["final"] is not None]
    reached = [p for p in mine if p["evaluations_to_95"] is not None]
    gain = sum(max(0.0, (p["final"] or 0.0) - 1.0) for p in mine) if not interpreted else None
    tokens = sum(p["input_tokens"] + p["output_tokens"] for p in mine)
    usd = sum(p["usd"] for p in mine)
    calls = sum(p["llm_calls"] for p in mine)
    fails: Counter = Counter()
    for p in mine:
        fails.update(p["failures"])
    n_eval = sum(p["evaluations"] for p in mine)
    return {
        "group": g, "runs": len(mine), "problems": len({p["problem_id"] for p in mine}),
        "seeds": sorted({p["seed"] for p in mine}), "correct_found": len(finals),
        "final_median": _pct(finals, 50), "final_p25": _pct(finals, 25), "final_p75": _pct(finals, 75),
        "final_geomean": _geomean(finals),
        "final_normalized_mean": float(np.mean([p["final_normalized"] for p in mine])),
        "auc": auc, "auc_ci": [auc_lo, auc_hi],
        "evaluations_to_95_median": _pct([p["evaluations_to_95"] for p in reached], 50),
        "gpu_s_to_95_median": _pct([p["gpu_s_to_95"] for p in reached], 50),
        "reached_95": len(reached), "evaluations": n_eval, "evaluations_spent": sum(p["evaluations_spent"] for p in mine),
        "gpu_s": sum(p["gpu_s"] for p in mine),
        "llm": {"calls": calls, "input_tokens": sum(p["input_tokens"] for p in mine),
                "output_tokens": sum(p["output_tokens"] for p in mine), "tokens": tokens, "usd": usd,
                "gain": gain,
                "tokens_per_gain": tokens / gain if calls and gain else None,
                "usd_per_gain": usd / gain if calls and gain else None},
        "failures": dict(fails.most_common()), "failed": sum(fails.values()),
        "failure_rate": sum(fails.values()) / n_eval if n_eval else None}


def _pair_row(a: str, b: str, per_run: list[dict], tie: float, n_boot: int, seed: int, called: bool = True) -> dict:
    """Group ``a`` against ``b`` over the (problem, seed) pairs both ran: wins/ties/losses of the normalized
    finals, their mean difference with a bootstrap interval over problems, Wilcoxon's p, the geomean ratio.
    ``called=False`` (interpreted runs): the pairs are counted, no win, loss or difference is stated."""
    ra = {(p["problem_id"], p["seed"]): p for p in per_run if p["group"] == a}
    rb = {(p["problem_id"], p["seed"]): p for p in per_run if p["group"] == b}
    keys = sorted(set(ra) & set(rb))
    if not called:
        return {"a": a, "b": b, "pairs": len(keys), "called": False, "wins": None, "ties": None, "losses": None,
                "mean_diff": None, "ci": [None, None], "wilcoxon_p": None, "ratio_geomean": None,
                "problems": len({k[0] for k in keys})}
    w = t = lo = 0
    diffs: dict[str, list[float]] = defaultdict(list)
    flat, ratios = [], []
    for k in keys:
        x, y = ra[k]["final_normalized"], rb[k]["final_normalized"]
        if abs(x - y) <= tie * max(abs(x), abs(y)):
            t += 1
        elif x > y:
            w += 1
        else:
            lo += 1
        diffs[k[0]].append(x - y)
        flat.append(x - y)
        fa, fb = ra[k]["final"], rb[k]["final"]
        if fa and fb and fa > 0 and fb > 0:
            ratios.append(math.log(fa / fb))
    mean, ci_lo, ci_hi = _cluster_boot(diffs, n_boot, seed)
    return {"a": a, "b": b, "pairs": len(keys), "called": True, "wins": w, "ties": t, "losses": lo,
            "mean_diff": mean, "ci": [ci_lo, ci_hi], "wilcoxon_p": _wilcoxon(flat),
            "ratio_geomean": math.exp(sum(ratios) / len(ratios)) if ratios else None,
            "problems": len(diffs)}


def compare(store: Any, *, study: str | None = None, campaigns: tuple[str, ...] | list[str] = (),
            by: str = "strategy", tie: float = 0.01, n_boot: int = 10_000, seed: int = 0) -> dict:
    """Collect the runs and analyze them: the ``--json`` document (the page renders the same)."""
    if not 0 <= tie < 1:
        raise CompareError(f"--tie {tie}: a relative difference in [0, 1)")
    runs, meta = collect(store, study=study, campaigns=campaigns)
    result = analyze(runs, by=by, tie=tie, n_boot=n_boot, seed=seed)
    result.update(meta)
    result["campaigns"] = sorted({r.campaign for r in runs})
    result["database"] = str(store.path)
    result["date"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return result


# ------------------------------------------------------------------------------------------------
# presentation
# ------------------------------------------------------------------------------------------------
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

