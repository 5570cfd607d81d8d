"""The statistics of a comparison: curves, bootstrap intervals over clustered runs, paired tests."""

from __future__ import annotations

import datetime as _dt
import math
from collections import Counter, defaultdict
from typing import Any

from kernellab.compare.runs import GROUPINGS, INTERPRETED_LABEL, OBJECTIVE_LABELS, REACH, CompareError, Run, collect


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
