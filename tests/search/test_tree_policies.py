"""The tree view and the four selection policies on synthetic trees in a real in-memory store."""

from __future__ import annotations

import pytest
from search_synth import GPU, Synth, result

from kernellab.search import POLICIES, Tree, find_reusable, get_policy, reuse_settings, reused_result


def names(synth: Synth, nodes) -> list[str]:
    return [synth.name(n) for n in nodes]


def test_tree_nodes_scores_and_failures(synth) -> None:
    tree = Tree(synth.store, synth.cid, synth.pid)
    assert len(tree) == 8
    assert names(synth, tree.roots()) == ["r"]
    assert names(synth, tree.children(synth.ids["r"])) == ["a", "b", "c"]
    a1, a2, c = tree[synth.ids["a1"]], tree[synth.ids["a2"]], tree[synth.ids["c"]]
    assert (a1.depth, a1.score, a1.status, a1.surrogate) == (2, 2.0, "correct", False)
    assert (a2.score, a2.status, a2.error_class) == (None, "compile_error", "CompilationError")
    assert (c.score, c.status, c.error_class) == (None, "incorrect", "mismatch")
    assert names(synth, tree.scored()) == ["r", "a", "b", "a1", "b1", "c1"]
    assert synth.name(tree.best()) == "a1"
    assert names(synth, tree.subtree(synth.ids["a"])) == ["a", "a1", "a2"]


def test_score_takes_best_judged_evaluation_and_ignores_trials(store) -> None:
    t = Synth(store)
    t.add("r", speedup=1.5)
    store.add_evaluation(t.ids["r"], result(3.0, config={"BLOCK": 64}), kind="trial")  # Optuna's, not judged
    assert Tree(store, t.cid, t.pid)[t.ids["r"]].score == 1.5
    store.add_evaluation(t.ids["r"], result(1.8, config={"BLOCK": 128}), kind="retime")
    node = Tree(store, t.cid, t.pid)[t.ids["r"]]
    assert node.score == 1.8 and node.best["config"] == {"BLOCK": 128}


def test_interpreted_timings_get_a_marked_surrogate_score(store) -> None:
    t = Synth(store)
    t.add("r", speedup=4.0, interpreted=True, eager_ms=100.0)  # median 25 ms, no speedup recorded
    node = Tree(store, t.cid, t.pid)[t.ids["r"]]
    assert node.best["speedup_eager"] is None
    assert node.score == pytest.approx(4.0) and node.surrogate is True
    t.add("u", "r", status=None)  # not evaluated yet
    assert Tree(store, t.cid, t.pid)[t.ids["u"]].status is None


def test_objective_compile(store) -> None:
    t = Synth(store)
    t.add("r", speedup=1.5, speedup_compile=0.7)
    assert Tree(store, t.cid, t.pid, objective="speedup_compile")[t.ids["r"]].score == 0.7
    with pytest.raises(ValueError, match="objective"):
        Tree(store, t.cid, t.pid, objective="speed")


def test_find_reusable_matches_device_versions_settings_and_kind(store) -> None:
    """The rules of search.find_reusable on rows another campaign recorded (the campaign's evaluate
    step and its end-to-end test: tests/campaign/test_reuse.py)."""
    job = reuse_settings(trials=5, small=False, mode="train")
    versions = {"torch": "2.9", "triton": "3.5", "cuda": "12.8", "driver": "570", "python": "3.12", "commit": "a"}
    first = Synth(store, name="first")
    cand = first.add("r", status=None)
    full = store.add_evaluation(cand, result(1.7, versions=versions, details={"settings": job, "gpu_s": 2.0}))
    store.add_evaluation(cand, result(3.0, versions=versions, details={"settings": job}, config={"B": 64}), kind="retime")
    second = Synth(store, name="second")

    def find(source="# r\n", **kw):
        args = dict(device=GPU, versions={**versions, "commit": "b"}, job=job, gpu=True)  # commit: not compared
        return find_reusable(store, second.pid, source, **{**args, **kw})

    assert find()["id"] == full
    assert find(source="# other\n") is None
    assert find(device="NVIDIA H100") is None
    assert find(versions={**versions, "driver": "580"}) is None
    assert find(job=reuse_settings(trials=2, small=False, mode="train")) is None
    assert find(config={"B": 64}) is None  # the retime row of that config is never reused
    reused = reused_result(find())
    assert reused["details"] == {"settings": job, "gpu_s": 0.0, "reused_from": full}
    assert reused["speedup_eager"] == 1.7 and "id" not in reused and "candidate_id" not in reused
    # a copy points at the original, and the original is preferred to it
    copy = store.add_evaluation(second.add("r", status=None), reused)
    assert find()["id"] == full and reused_result(store.get_evaluation(copy))["details"]["reused_from"] == full
    # an interpreted timing: reusable by a CPU campaign, never by a GPU one
    third = Synth(store, name="third")
    interp = store.add_evaluation(third.add("i", status=None),
                                  result(2.0, interpreted=True, versions=versions, details={"settings": job}))
    assert find(source="# i\n") is None and find(source="# i\n", gpu=False)["id"] == interp


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_empty_or_failed_tree_selects_nothing(store, name) -> None:
    t = Synth(store)
    policy = get_policy(name, seed=0)
    assert policy.select(Tree(store, t.cid, t.pid), 3) == []
    t.add("r", status="compile_error")
    assert policy.select(Tree(store, t.cid, t.pid), 3) == []


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("k", [1, 3, 8])
def test_policies_return_k_scored_nodes_deterministically(synth, name, k) -> None:
    tree = Tree(synth.store, synth.cid, synth.pid)
    picks = get_policy(name, seed=7).select(tree, k)
    assert len(picks) == k and all(p.score is not None for p in picks)
    assert names(synth, picks) == names(synth, get_policy(name, seed=7).select(tree, k))


def test_greedy_picks_the_best(synth) -> None:
    tree = Tree(synth.store, synth.cid, synth.pid)
    assert names(synth, get_policy("greedy").select(tree, 3)) == ["a1", "a", "b1"]
    assert names(synth, get_policy("greedy").select(tree, 8)) == ["a1", "a", "b1", "b", "c1", "r", "a1", "a"]


def test_beam_stays_on_the_deepest_level(synth) -> None:
    tree = Tree(synth.store, synth.cid, synth.pid)
    assert names(synth, get_policy("beam", width=2).select(tree, 3)) == ["a1", "b1", "a1"]
    synth.add("a1x", "a1", 1.9)  # depth 3 opens: the beam moves down
    tree.reload()
    assert names(synth, get_policy("beam", width=2).select(tree, 2)) == ["a1x", "a1x"]
    with pytest.raises(ValueError, match="width"):
        get_policy("beam", width=0)


def test_uct_balances_mean_reward_and_exploration(synth) -> None:
    tree = Tree(synth.store, synth.cid, synth.pid)
    # rewards score/2.0; a's subtree mean (0.75+1+0)/3 is dragged down by the failed a2, so pure
    # exploitation (c=0) walks to b1 first; its virtual visit then sends the second pick to a1.
    assert names(synth, get_policy("uct", c=0.0).select(tree, 2)) == ["b1", "a1"]
    # with c = sqrt(2) the third pick explores below the failed c, to its debugged child c1
    # (hand-computed UCB1 values: at r, c: 1.877 > b: 1.724 > stay: 1.633 > a: 1.570)
    assert names(synth, get_policy("uct").select(tree, 3)) == ["b1", "a1", "c1"]


def test_evolve_tournament_and_crossover(synth) -> None:
    tree = Tree(synth.store, synth.cid, synth.pid)
    # a tournament over the whole population always wins with the best; the partner wins among the rest
    picks = get_policy("evolve", population=6, tournament=6, crossover=1.0).select(tree, 3)
    assert names(synth, picks) == ["a1"] * 3 and {p.partner for p in picks} == {synth.ids["a"]}
    # the population is the 2 best: nothing outside it is ever picked, and no crossover at rate 0
    picks = get_policy("evolve", seed=3, population=2, tournament=1, crossover=0.0).select(tree, 20)
    assert set(names(synth, picks)) == {"a1", "a"} and all(p.partner is None for p in picks)
    a = [synth.name(p) for p in get_policy("evolve", seed=1, tournament=2).select(tree, 12)]
    b = [synth.name(p) for p in get_policy("evolve", seed=2, tournament=2).select(tree, 12)]
    assert a != b  # the seed matters (12 draws from 6 nodes: equal sequences would be a 1-in-millions event)


def test_get_policy_errors() -> None:
    with pytest.raises(ValueError, match="unknown search policy 'best'.*greedy"):
        get_policy("best")
    with pytest.raises(ValueError, match="bad options for policy 'greedy'"):
        get_policy("greedy", width=3)
    with pytest.raises(ValueError, match="exploration"):
        get_policy("uct", c=-1)
