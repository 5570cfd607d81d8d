"""On the CPU the search explores: interpreted candidates are ranked by the builtin cost model's
modelled H200 time (``details.modelled``), never reported as speedups, and every policy goes three
levels deep within a small budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernellab.agents.builtin import build
from kernellab.agents.builtin.modelled import config_variants, literal_config, model_candidate, modelled_ms
from kernellab.agents.builtin.planner import modelled_time
from kernellab.campaign import CampaignConfig, run_campaign, start_campaign
from kernellab.compiler.cost import eager_profile
from kernellab.problem import load_problem
from kernellab.search import POLICIES, Tree, read_space, score_of
from kernellab.store import Store

ROOT = Path(__file__).resolve().parents[2]
GEMM = ROOT / "experiments" / "problems" / "fusions" / "gemm_bias_gelu.py"
POINTWISE = ROOT / "experiments" / "problems" / "fusions" / "pointwise_chain.py"


def test_the_modelled_time_follows_the_configuration():
    problem = load_problem(GEMM)
    seed = build(problem)
    config = literal_config(seed.source)
    (gid,) = config
    base = modelled_ms(problem, [], config)
    assert base.ms > 0 and base.eager_ms > 0 and set(base.groups) == {gid}
    assert modelled_ms(problem, []).ms == pytest.approx(base.ms)  # None: the generated file's own CONFIG
    # tiles that leave most of the 132 SMs idle, a shallow pipeline: slower, by the model too
    tiny_grid = {gid: {**config[gid], "BLOCK_M": 256, "BLOCK_N": 256}}
    shallow = {gid: {**config[gid], "num_stages": 2}}
    assert modelled_ms(problem, [], tiny_grid).ms > base.ms
    assert modelled_ms(problem, [], shallow).ms > base.ms
    # a pointwise kernel of one element per thread and a 2-warp block cannot keep enough bytes in flight
    pw = load_problem(POINTWISE)
    pcfg = literal_config(build(pw).source)
    (pg,) = pcfg
    narrow = {pg: {**pcfg[pg], "BLOCK": 64, "num_warps": 2}}
    assert modelled_ms(pw, [], narrow).ms > modelled_ms(pw, [], pcfg).ms


def test_the_eager_profile_is_the_reference_op_by_op():
    from kernellab.agents.builtin import graph_of

    prof = eager_profile(graph_of(load_problem(GEMM)))
    names = [o["name"] for o in prof["ops"]]
    assert prof["modelled"] and len(names) == len(set(names))
    assert any("linear" in n or "mm" in n for n in names) and any("gelu" in n for n in names)
    assert sum(o["ms"] for o in prof["ops"]) == pytest.approx(prof["eager_ms"], rel=1e-3)


def test_model_candidate_reads_builtin_candidates_only():
    problem = load_problem(GEMM)
    seed = build(problem)
    row = {"source": seed.source, "meta": seed.meta}
    m = model_candidate(problem, row, {"status": "correct", "config": {}})
    # the geometric mean of the configuration's model and the planner's (structural actions)
    expect = (modelled_ms(problem, []).ms * modelled_time(problem, seed.meta["actions"]) * 1e3) ** 0.5
    assert m["ms"] == pytest.approx(expect, rel=1e-4)
    # a trial's config is applied over the candidate's CONFIG, as the sandbox applies it
    (gid,) = literal_config(seed.source)
    tuned = model_candidate(problem, row, {"config": {gid: {"num_stages": 2}}})
    assert tuned["ms"] > m["ms"]
    assert model_candidate(problem, {"source": seed.source, "meta": {}}, {}) is None  # e.g. an LLM's file


def test_config_variants_are_new_space_choices_ranked_by_the_model():
    problem = load_problem(GEMM)
    seed = build(problem)
    sp, cfg = read_space(seed.source)
    row = {"id": "s", "parent_id": None, "selected": True, "source": seed.source, "meta": seed.meta, "space": sp,
           "best": {"status": "correct", "config": {}}}
    props = config_variants(problem, [row], 5)
    assert len(props) == 5 and all(p.parent_id == "s" for p in props)
    times = []
    for p in props:
        ((name, value),) = p.action["values"]
        gid = p.action["group"]
        assert value in sp[gid][name] and value != cfg[gid][name]
        times.append(modelled_ms(problem, [], {gid: {**cfg[gid], name: value}}).ms)
    assert times == sorted(times)
    # a variant tried from this node already is not proposed again
    child = {"id": "c", "parent_id": "s", "meta": {"actions": [props[0].action]}}
    again = config_variants(problem, [row, child], 5)
    assert props[0].action not in [p.action for p in again]
    # a library-only node ran none of its kernels: no parameter of theirs changes what runs
    assert config_variants(problem, [{**row, "best": {**row["best"], "library_only": True}}], 5) == []


def test_an_interpreted_score_is_the_modelled_ratio_and_never_a_speedup():
    ev = {"status": "correct", "interpreted": True, "speedup_eager": None, "eager_ms": 3.0, "median_ms": 30.0,
          "details": {"modelled": {"ms": 0.5, "eager_ms": 1.0}}}
    assert score_of(ev, "speedup_eager") == (2.0, True)
    plain = {**ev, "details": {}}
    assert score_of(plain, "speedup_eager") == (0.1, True)  # no model: the interpreter's own ratio


@pytest.mark.slow
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_explores_three_levels_deep_on_the_cpu(policy):
    store = Store(":memory:")
    cfg = CampaignConfig(problems=[str(GEMM)], budget=10, width=2, trials=1, policy=policy)
    cid = start_campaign(store, cfg, name=f"depth-{policy}")
    summary = run_campaign(store, cid)
    cands = store.candidates(cid)
    assert max(c["depth"] for c in cands) >= 3, [(c["depth"], c["action"]) for c in cands]
    fulls = [e for e in store.evaluations(campaign_id=cid) if e["kind"] == "full" and e["status"] == "correct"]
    assert fulls and all(e["interpreted"] and e["details"].get("modelled") for e in fulls)
    (best,) = summary["best"]
    assert best["interpreted"] and best["speedup_eager"] is None and best["speedup_compile"] is None
    tree = Tree(store, cid, cands[0]["problem_id"])
    assert all(n.surrogate for n in tree.scored())


@pytest.mark.gpu
def test_on_a_gpu_scores_are_measured_never_modelled():
    store = Store(":memory:")
    # neither tuning nor the Inductor seed (their own GPU tests cover them): 247 s with both, under the suite's load
    cfg = CampaignConfig(problems=[str(GEMM)], budget=3, width=2, trials=2, tune_trials=0, inductor_seed=False)
    cid = start_campaign(store, cfg, name="gpu-measured")
    run_campaign(store, cid)
    fulls = [e for e in store.evaluations(campaign_id=cid) if e["kind"] == "full" and e["status"] == "correct"]
    assert fulls and not any(e["interpreted"] or "modelled" in (e["details"] or {}) for e in fulls)
    tree = Tree(store, cid, store.candidates(cid)[0]["problem_id"])
    assert tree.scored() and not any(n.surrogate for n in tree.scored())
    # the planner ranked by the reference profile the campaign recorded
    (ref,) = store.events(cid, "reference")
    assert ref["payload"]["profile"]["ops"]
