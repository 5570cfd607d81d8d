"""compare's statistics on hand-built stores with known numbers (rows written through the real store API)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from study_store import PROBLEMS, SEEDS, add_run

from kernellab.cli import main
from kernellab.compare import CompareError, analyze, collect, compare, render_html
from kernellab.store import Store


def _a_final(i: int, s: int) -> float:
    return 2.0 + 0.1 * i + 0.01 * s


def _b_final(i: int, s: int) -> float:
    return 1.5 + 0.1 * i


def _known(store: Store) -> None:
    """greedy with an LLM beats beam (builtin) on every (problem, seed): A's finals are 2.0 + 0.1 i + 0.01 s,
    B's 1.5 + 0.1 i. A also has a faster candidate that is not a kernel win (library-only, or a low own-kernel
    share): it must count for nothing. B has one mismatch per run."""
    for i, prob in enumerate(PROBLEMS):
        for s in SEEDS:
            add_run(store, f"A-{i}-{s}", prob, policy="greedy", seed=s, llm="anthropic:m",
                    values=[{"speedup": 1.0}, {"speedup": _a_final(i, s)},
                            {"speedup": 10.0, "library_only": True}, {"speedup": 9.0, "own_kernel_share": 0.3}],
                    calls=[{"input_tokens": 1000, "output_tokens": 200, "cost_usd": 0.01,
                            "prompt_version": "coder-aaaa"}])
            add_run(store, f"B-{i}-{s}", prob, policy="beam", seed=s,
                    values=[{"speedup": 1.0}, {"status": "incorrect", "error_class": "mismatch", "speedup": None},
                            {"speedup": _b_final(i, s)}])


def test_strictly_better_strategy_wins_every_pair_with_a_small_p_and_an_interval_above_zero() -> None:
    store = Store(":memory:")
    _known(store)
    campaigns = [c["name"] for c in store.list_campaigns()]
    result = compare(store, campaigns=campaigns, n_boot=2000)
    a = next(g for g in result["groups"] if g.startswith("greedy"))
    b = next(g for g in result["groups"] if g.startswith("beam"))
    assert a == "greedy · anthropic:m · prompts " + result["runs"][0]["prompts"] and b == "beam · builtin · no prompts"
    pair = next(p for p in result["pairs"] if p["a"] == a and p["b"] == b)
    n = len(PROBLEMS) * len(SEEDS)
    assert (pair["pairs"], pair["wins"], pair["ties"], pair["losses"]) == (n, n, 0, 0)
    assert pair["wilcoxon_p"] == pytest.approx(2 / 2 ** n)  # exact: every sign positive
    assert pair["ci"][0] > 0 and pair["mean_diff"] > 0
    back = next(p for p in result["pairs"] if p["a"] == b and p["b"] == a)
    assert (back["wins"], back["losses"]) == (0, n) and back["ci"][1] < 0
    assert pair["ratio_geomean"] == pytest.approx(math.exp(sum(
        math.log(_a_final(i, s) / _b_final(i, s)) for i in range(4) for s in SEEDS) / n))

    sa = next(s for s in result["strategies"] if s["group"] == a)
    sb = next(s for s in result["strategies"] if s["group"] == b)
    # the faster candidates that are not kernel wins count for nothing: the finals are the known ones
    finals = sorted(r["final"] for r in result["runs"] if r["group"] == a)
    assert finals == pytest.approx(sorted(_a_final(i, s) for i in range(4) for s in SEEDS))
    assert not result["interpreted"] and result["value_label"] == "speedup vs eager"
    # A reaches 95% of the best on its second evaluation (1 GPU-second); B never does
    assert sa["evaluations_to_95_median"] == 2 and sa["gpu_s_to_95_median"] == pytest.approx(1.0)
    assert sa["reached_95"] == n and sb["reached_95"] == 0 and sb["evaluations_to_95_median"] is None
    # AUC of A's run (p0, seed 0) by hand: horizon 4 evaluations, best on p0 = 2.01
    run = next(r for r in result["runs"] if r["campaign"] == "A-0-0")
    assert run["auc"] == pytest.approx((1.0 + 3 * 2.0) / 2.01 / 4)
    assert result["horizon"] == 4 and sa["auc"] > sb["auc"]
    # LLM cost per unit of gain: 8 calls of 1200 tokens and $0.01 over the summed gain max(0, final - 1)
    gain = sum(_a_final(i, s) - 1 for i in range(4) for s in SEEDS)
    assert sa["llm"]["gain"] == pytest.approx(gain)
    assert sa["llm"]["tokens_per_gain"] == pytest.approx(8 * 1200 / gain)
    assert sa["llm"]["usd_per_gain"] == pytest.approx(0.08 / gain)
    assert sb["llm"]["calls"] == 0 and sb["llm"]["usd_per_gain"] is None
    # failure classes per strategy
    assert sb["failures"] == {"mismatch": n} and sb["failure_rate"] == pytest.approx(1 / 3)
    assert sa["failures"] == {} and sa["failed"] == 0
    # the curves: at evaluation 1 every run has 1.0, at 2 A's median is its finals' median
    ca = result["curves"][a]["evaluations"]
    assert ca["median"][0] == pytest.approx(1.0)
    assert ca["median"][1] == pytest.approx(sorted(finals)[3] / 2 + sorted(finals)[4] / 2)
    cb = result["curves"][b]["evaluations"]
    assert cb["median"][1] == pytest.approx(1.0) and cb["median"][2] == pytest.approx(1.7 + 0.0 - 0.05)

    html = render_html(result)
    assert html.count("<svg") == 4 and "Wilcoxon" in html and "no speedup is claimed" not in html


def test_equal_strategies_tie_everywhere() -> None:
    store = Store(":memory:")
    for i, prob in enumerate(PROBLEMS):
        for s in SEEDS:
            for policy in ("uct", "evolve"):
                add_run(store, f"{policy}-{i}-{s}", prob, policy=policy, seed=s,
                        values=[{"speedup": 1.2 + i}, {"status": "compile_error", "error_class": "CompilationError"}])
    runs, meta = collect(store, campaigns=[c["name"] for c in store.list_campaigns()])
    assert not meta["unfinished"] and len(runs) == 16
    result = analyze(runs, by="policy", n_boot=500)
    assert result["groups"] == ["evolve", "uct"]
    pair = result["pairs"][0]
    assert (pair["wins"], pair["ties"], pair["losses"]) == (0, 8, 0)
    assert pair["wilcoxon_p"] == 1.0 and pair["mean_diff"] == 0.0 and pair["ci"] == [0.0, 0.0]
    assert all(s["failures"] == {"CompilationError": 8} for s in result["strategies"])


def test_prompt_versions_compare_as_an_ab_by_content_hash() -> None:
    """Same policy, agents, problems and seeds; only the prompt version (as the LLM calls record it) differs."""
    store = Store(":memory:")
    for i, prob in enumerate(PROBLEMS):
        for s in SEEDS:
            for version, gain in (("coder-1111", 0.5), ("coder-2222", 0.2)):
                add_run(store, f"{version}-{i}-{s}", prob, policy="greedy", seed=s, llm="anthropic:m",
                        values=[{"speedup": 1.0 + gain + 0.1 * i}],
                        calls=[{"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.001, "prompt_version": version}])
    result = compare(store, campaigns=[c["name"] for c in store.list_campaigns()], n_boot=500)
    assert len(result["groups"]) == 2 and all(g.startswith("prompts ") for g in result["groups"])
    assert compare(store, campaigns=[c["name"] for c in store.list_campaigns()], by="prompts",
                   n_boot=500)["groups"] == result["groups"]
    by_version = {r["campaign"].split("-")[1]: r["group"] for r in result["runs"]}
    better = next(p for p in result["pairs"] if p["a"] == by_version["1111"])
    assert (better["wins"], better["pairs"]) == (8, 8)
    # grouped by policy the two versions are one group: nothing to pair
    assert compare(store, campaigns=[c["name"] for c in store.list_campaigns()], by="policy")["pairs"] == []


def test_interpreted_runs_claim_no_speedup_and_no_gain() -> None:
    store = Store(":memory:")
    for i, prob in enumerate(PROBLEMS[:2]):
        for policy in ("greedy", "beam"):
            add_run(store, f"{policy}-{i}", prob, policy=policy, seed=0, llm="anthropic:m",
                    values=[{"interpreted": True, "median_ms": 40.0 + i, "eager_ms": 10.0}],
                    calls=[{"input_tokens": 10, "output_tokens": 5, "cost_usd": 0.5}])
    result = compare(store, campaigns=[c["name"] for c in store.list_campaigns()], n_boot=100)
    assert result["interpreted"] and "not a speedup" in result["value_label"]
    assert result["runs"][0]["final"] == pytest.approx(10.0 / 40.0)  # the interpreter's surrogate ratio
    for s in result["strategies"]:
        assert s["llm"]["gain"] is None and s["llm"]["usd_per_gain"] is None and s["llm"]["usd"] == pytest.approx(1.0)
    html = render_html(result)
    assert "no speedup is claimed" in html and "not claimed (interpreted)" in html


def test_unfinished_runs_are_left_out_and_named() -> None:
    store = Store(":memory:")
    add_run(store, "done", PROBLEMS[0], policy="greedy", seed=0, values=[{"speedup": 1.5}])
    add_run(store, "half", PROBLEMS[0], policy="beam", seed=0, values=[{"speedup": 3.0}], status="stopped")
    result = compare(store, campaigns=["done", "half"], n_boot=100)
    assert result["groups"] == ["greedy"] and result["unfinished"] == [
        {"campaign": "half", "problem": "p0", "status": "stopped"}]
    with pytest.raises(CompareError, match="no finished campaign"):
        compare(store, campaigns=["half"])


def test_compare_cli_errors_are_one_line(tmp_path) -> None:
    db = tmp_path / "k.db"
    with Store(db) as s:
        add_run(s, "c1", PROBLEMS[0], policy="greedy", seed=0, values=[{"speedup": 1.5}])
    for args, msg in (([], "give --study NAME or one or more CAMPAIGNs"),
                      (["--study", "x", "c1"], "not both"),
                      (["--study", "nope"], "no study 'nope'"),
                      (["nope"], "no campaign 'nope'"),
                      (["c1", "--tie", "2"], "--tie 2.0")):
        r = CliRunner().invoke(main, ["compare", *args, "--db", str(db)])
        assert r.exit_code == 2 and r.stderr.strip().count("\n") == 0 and msg in r.stderr, (args, r.stderr)
    r = CliRunner().invoke(main, ["compare", "c1", "--db", str(db), "--json", "-o", str(tmp_path / "p.html")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["groups"] == ["greedy"] and out["html"] == str(tmp_path / "p.html")
    assert (tmp_path / "p.html").read_text().startswith("<!doctype html>")


def test_a_gpu_evaluation_without_the_objective_has_no_value() -> None:
    """Under speedup_compile, an evaluation with no torch.compile timing is not scored by its eager ratio
    (the search's interpreter surrogate); only measured speedups vs torch.compile count."""
    store = Store(":memory:")
    add_run(store, "c", PROBLEMS[0], policy="greedy", seed=0, objective="speedup_compile",
            values=[{"speedup": 1.0}, {"speedup": 5.0, "speedup_compile": None, "compile_ms": None}])
    result = compare(store, campaigns=["c"], n_boot=10)
    run = result["runs"][0]
    assert result["value_label"] == "speedup vs torch.compile"
    assert run["best"] == pytest.approx(1.2) and run["final"] == pytest.approx(1.2)


def test_llm_campaigns_record_their_prompts_hash_and_compare_groups_by_it() -> None:
    from kernellab.agents.llm import prompts_version
    from kernellab.campaign import CampaignConfig, start_campaign

    store = Store(":memory:")
    version = prompts_version("anthropic:m")
    assert version and version == prompts_version("openai:x") and prompts_version("builtin") is None
    cid = start_campaign(store, CampaignConfig(problems=["p0.py"], llm="anthropic:m"), problems=[PROBLEMS[0]])
    assert store.get_campaign(cid)["config"]["prompts"] == version
    cid2 = start_campaign(store, CampaignConfig(problems=["p0.py"]), name="b", problems=[PROBLEMS[0]])
    assert "prompts" not in store.get_campaign(cid2)["config"]
    for c in (cid, cid2):
        cand = store.add_candidate(c, PROBLEMS[0].id, f"class ModelNew: pass  # {c}\n")
        store.add_evaluation(cand, {"status": "correct", "median_ms": 1.0, "eager_ms": 1.5, "speedup_eager": 1.5})
        store.update_campaign(c, status="done")
    result = compare(store, campaigns=[cid, cid2], by="prompts", n_boot=10)
    assert result["groups"] == ["no prompts", f"prompts {version}"]


def test_interpreted_curves_and_finals_share_one_definition_and_no_pair_is_called() -> None:
    """A search scored by the cost model's H200 estimate (``details.modelled``) plotted 2.8-3.6 beside finals
    of 0.24 under the label "interpreted eager/candidate time ratio": the page uses that ratio for both."""
    store = Store(":memory:")
    for policy, ms in (("greedy", 40.0), ("beam", 41.0)):
        add_run(store, policy, PROBLEMS[0], policy=policy, seed=0,
                values=[{"interpreted": True, "median_ms": ms, "eager_ms": 10.0,
                         "details": {"gpu_s": 0.5, "modelled": {"ms": 1.0, "eager_ms": 3.2}}}])
    result = compare(store, campaigns=["greedy", "beam"], n_boot=100)
    for run in result["runs"]:
        assert run["best"] == pytest.approx(run["final"]) and run["final"] < 0.3, run
    assert max(v for v in result["curves"]["greedy"]["evaluations"]["median"] if v is not None) < 0.3
    (pair,) = [p for p in result["pairs"] if p["a"] == "beam"]
    assert pair["called"] is False and pair["wins"] is None and pair["pairs"] == 1
    html = render_html(result)
    assert "not called (interpreted)" in html and "1 (0)" in html  # one seed, seed 0
