"""The tree view and the four selection policies on synthetic trees in a real in-memory store."""

from __future__ import annotations

import pytest
from kernellab.search import POLICIES, Tree, get_policy
from search_synth import Synth, result


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
    rows = tree.rows(selected=[a1])
    assert [r["selected"] for r in rows].count(True) == 1 and rows[4]["best"]["speedup_eager"] == 2.0


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


def test_duplicate_source_is_not_evaluated_twice(synth) -> None:
    tree = Tree(synth.store, synth.cid, synth.pid)
    calls = []

    def evaluate(source: str) -> dict:
        calls.append(source)
        return result(1.7)

    cid, res, reused = tree.evaluate_once("# new\n", evaluate, parent_id=synth.ids["a1"], action="x")
    assert (reused, res["speedup_eager"], len(calls)) == (False, 1.7, 1)
    cid2, res2, reused2 = tree.evaluate_once("# new\n", evaluate, parent_id=synth.ids["b1"], action="x")
    assert (cid2, reused2, res2["speedup_eager"], len(calls)) == (cid, True, 1.7, 1)
    assert tree[cid].score == 1.7
    # another campaign on the same device reuses the result; without a device it does not look outside
    other = Synth(synth.store, name="c2")
    t2 = Tree(synth.store, other.cid, synth.pid)
    assert t2.known_result("# new\n") is None
    cid3, res3, reused3 = t2.evaluate_once("# new\n", evaluate, device="NVIDIA H200")
    assert cid3 != cid and reused3 and len(calls) == 1
    assert t2[cid3].score == 1.7 and res3["details"]["reused_from"]
    assert Tree(synth.store, other.cid, synth.pid).known_result("# new\n", device="other GPU")["speedup_eager"] == 1.7
    assert t2.known_result("# never\n", device="NVIDIA H200") is None


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
