"""The builtin planner's action space (planner.applicable_actions) on bundled problems: several distinct
actions from the seed, every child correct in the real sandbox, and chains of actions three deep."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kernellab import sandbox
from kernellab.agents.builtin import Precision, build, built
from kernellab.agents.builtin.actions import Fuse, ReductionMode, Split
from kernellab.agents.builtin.planner import Applicable, applicable_actions, modelled_time
from kernellab.compiler.codegen import allow_tf32
from kernellab.problem import Problem, load_problem

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "experiments" / "problems"

# problems whose seed offers at least four structural actions (GEMM + epilogue / row reduction, bmm,
# a plain fp32 GEMM, two GEMMs in one block)
WIDE = ["fusions/gemm_bias_gelu", "fusions/linear_softmax", "fusions/linear_layernorm", "ops/gemm_square",
        "ops/bmm", "blocks/mlp"]
# rows and pointwise problems: fewer actions from the seed, still each child correct
NARROW = ["ops/softmax", "fusions/scaled_bias_softmax", "fusions/residual_layernorm", "fusions/pointwise_chain",
          "ops/gelu"]


def _problem(name: str) -> Problem:
    return load_problem(PROBLEMS / f"{name}.py")


def _hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _check(problem: Problem, source: str, what: str, device: str = "cpu", trials: int = 2) -> None:
    result = sandbox.evaluate(problem, source, small=device == "cpu", device=device, trials=trials, timing=False)
    assert result["status"] == "correct", f"{what}: {result['status']}: {(result['error_text'] or '')[:400]}"


def _children(problem: Problem, device: str = "cpu", trials: int = 2) -> list[Applicable]:
    """Every action from the seed gives a new source and a correct child."""
    seed = build(problem)
    seen = {_hash(seed.source)}
    acts = applicable_actions(problem)
    for x in acts:
        code = build(problem, [x.action])
        h = _hash(code.source)
        assert h not in seen, f"{x.text}: the same source as the seed or a sibling"
        seen.add(h)
        assert code.action == x.text
        _check(problem, code.source, x.text, device, trials)
    return acts


def _walk(problem: Problem, depth: int = 3, device: str = "cpu", trials: int = 2) -> list[str]:
    """Apply the best-ranked action whose source is new, ``depth`` times; every step correct."""
    actions: list = []
    seen = {_hash(build(problem).source)}
    texts = []
    for _ in range(depth):
        for x in applicable_actions(problem, actions):
            code = build(problem, [*actions, x.action])
            if _hash(code.source) not in seen:
                break
        else:
            pytest.fail(f"no new child after {texts}")
        seen.add(_hash(code.source))
        _check(problem, code.source, " -> ".join([*texts, x.text]), device, trials)
        actions.append(x.action)
        texts.append(x.text)
        assert code.meta["actions"] == [a.to_dict() for a in actions]
    return texts


@pytest.mark.parametrize("name", WIDE)
def test_seed_has_four_distinct_correct_children(name):
    acts = _children(_problem(name))
    assert len(acts) >= 4, [x.text for x in acts]
    assert len({x.text for x in acts}) == len(acts)
    assert acts == sorted(acts, key=lambda x: -x.expected_gain)
    for x in acts:
        assert x.expected_gain > 0 and 0.0 <= x.share <= 1.0 + 1e-9
        assert x.to_dict()["action"]["kind"] == x.action.kind


@pytest.mark.parametrize("name", NARROW)
def test_rows_and_pointwise_children_are_correct(name):
    assert len(_children(_problem(name))) >= 2


@pytest.mark.parametrize("name", ["fusions/gemm_bias_gelu", "ops/softmax", "fusions/scaled_bias_softmax"])
def test_chains_reach_depth_three_with_distinct_correct_sources(name):
    texts = _walk(_problem(name), 3)
    assert len(texts) == 3


def test_precision_follows_the_tolerance():
    """fp32 at 1e-4: ieee and tf32x3 (where its error bound admits it), never plain tf32; the same
    problem at 1e-2 may use tf32."""
    p = _problem("fusions/gemm_bias_gelu")
    assert p.settings()["atol"] == 1e-4 and not allow_tf32("float32", 1e-4, 1e-4)
    precs = {x.action.precision for x in applicable_actions(p) if isinstance(x.action, Precision)}
    assert precs == {"ieee"}  # the seed runs tf32x3 (a Linear weight)
    ieee = [x.action for x in applicable_actions(p) if isinstance(x.action, Precision)]
    back = {x.action.precision for x in applicable_actions(p, ieee) if isinstance(x.action, Precision)}
    assert back == set()  # tf32x3 again would be the seed
    # two fp32 inputs with K = 4096: 3xTF32's error exceeds 1e-4, so no cheaper precision at all
    sq = _problem("ops/gemm_square")
    assert not [x for x in applicable_actions(sq) if isinstance(x.action, Precision)]
    loose = Problem("gemm_bias_gelu_loose", p.source + "\nATOL = 1e-2\nRTOL = 1e-2\n")
    assert {x.action.precision for x in applicable_actions(loose) if isinstance(x.action, Precision)} \
        == {"ieee", "tf32x3"}  # the seed runs tf32 there


def test_undoing_an_action_is_not_offered():
    """A child that returns to an ancestor's state (split then fuse back, a mode and back) is left out:
    it would only rebuild a source the tree has."""
    p = _problem("ops/softmax")
    gid = built(p).groups[0].id
    first = applicable_actions(p)
    node = next(x.action.node for x in first if isinstance(x.action, Split))
    after = applicable_actions(p, [Split(node)])
    assert Fuse(node) not in [x.action for x in after]
    after_mode = applicable_actions(p, [ReductionMode(gid, "multi_pass")])
    assert ReductionMode(gid, "auto") not in [x.action for x in after_mode]  # back to the seed
    twice = applicable_actions(p, [ReductionMode(gid, "multi_pass"), Split(node)])
    assert Fuse(node) not in [x.action for x in twice]


def test_fuse_moves_a_boundary_back_after_other_changes():
    p = _problem("ops/softmax")
    gid = built(p).groups[0].id
    node = next(x.action.node for x in applicable_actions(p) if isinstance(x.action, Split))
    acts = [Split(node), ReductionMode(gid, "one_pass")]
    offered = [x.action for x in applicable_actions(p, acts)]
    # fusing back now lands on a state no ancestor had (one-pass, unsplit)
    assert Fuse(node) in offered


def test_expected_gain_follows_the_cost_model():
    """cuBLAS for an IEEE fp32 GEMM and split-K for a grid that leaves SMs idle rank first; splitting a
    fused epilogue out costs a round trip of the GEMM's output and ranks below 1."""
    sq = applicable_actions(_problem("ops/gemm_square"))
    assert sq[0].action.kind == "library_gemm" and sq[0].expected_gain > 1.2
    fused = applicable_actions(_problem("fusions/gemm_bias_gelu"))
    split = next(x for x in fused if isinstance(x.action, Split))
    assert split.expected_gain < 1.0
    soft = applicable_actions(_problem("fusions/scaled_bias_softmax"))
    assert all(x.expected_gain < 1.0 for x in soft if isinstance(x.action, Split))
    # the modelled time of a child is consistent with its gain (share 1: one group)
    p = _problem("ops/softmax")
    x = applicable_actions(p)[0]
    assert modelled_time(p) / modelled_time(p, [x.action]) == pytest.approx(x.expected_gain, rel=1e-6)


def test_profile_shares_reorder_the_actions():
    """A reference profile that puts 40% of the time in layer norm (``aten::native_layer_norm``, matched to
    the groups that run it) raises the share of the layer-norm groups' actions from the model's ~1% to
    20% each, and their gains move with it; addmm's time is split over the Linear groups by model time."""
    p = _problem("blocks/transformer_block")
    ln = next(g.id for g in built(p).groups if g.kind == "rows" and "layer_norm" in g.id)
    ops = [{"name": "aten::addmm", "ms": 0.6, "share": 0.6}, {"name": "aten::native_layer_norm", "ms": 0.4,
                                                              "share": 0.4}]
    plain = {x.text: x for x in applicable_actions(p)}
    prof = {x.text: x for x in applicable_actions(p, None, {"ops": ops})}
    assert plain.keys() == prof.keys()
    mine = [t for t, x in prof.items() if x.group == ln]
    assert mine
    for t in mine:
        assert plain[t].share < 0.05 and prof[t].share == pytest.approx(0.2)
        assert abs(prof[t].expected_gain - 1) > abs(plain[t].expected_gain - 1)
    linear = {x.group: x.share for x in prof.values() if x.group.startswith("g_linear")}
    assert sum(linear.values()) == pytest.approx(0.6, abs=0.01)


def test_persistent_pointwise_walks_several_blocks_per_program(load):
    """The persistent pointwise kernel is a grid-stride loop: on the interpreter three programs cover the
    small domain's five 1024-wide blocks, and the output matches the flat kernel's."""
    import torch

    from kernellab.agents.builtin import Persistent
    from kernellab.problem import instantiate

    p = _problem("fusions/pointwise_chain")
    gid = next(g.id for g in built(p).groups if g.kind == "pointwise")
    code = build(p, [Persistent(gid)])
    assert f"k_{gid}_persist[grid]" in code.source and f"k_{gid}[grid]" not in code.source
    inst = instantiate(p, small=True, seed=0)
    assert inst.inputs[0].numel() > 4 * 1024
    cand = instantiate(p, small=True, seed=0, model_cls=load(code.source).ModelNew)
    with torch.no_grad():
        torch.testing.assert_close(cand.model(*inst.inputs), inst.model(*inst.inputs), atol=1e-4, rtol=1e-4)


LOSS = """import torch

rows = 4
n = 1 << 20
SMALL = {"rows": 3, "n": 4096}


class Model(torch.nn.Module):
    def forward(self, a, b):
        return torch.mean((a - b) ** 2)


def get_inputs():
    return [torch.randn(rows, n), torch.randn(rows, n)]


def get_init_inputs():
    return []
"""
ROWMAX = LOSS.replace("torch.mean((a - b) ** 2)", "torch.amax(a * 2.0 - b, dim=-1), torch.sum(a, dim=1)")


@pytest.mark.parametrize("src", [LOSS, ROWMAX], ids=["mse_loss", "row_max_sum"])
def test_the_seed_splits_few_long_rows(src):
    """A mean over everything (one row) and a max / sum over 4 rows of 2^20: one program a row would
    leave the GPU idle (KernelBench's 100_HingeLoss: 442 ms against torch.compile's 0.95), so the seed
    launches chunks as rows of their own (SPLIT_R, tunable, ``codegen.auto_split_r``), the cost model
    counts them, and it is correct in the sandbox at SMALL size, where 3 x 4096 elements still split into
    chunks of >= 256. No planner child repeats the split."""
    from kernellab.agents.builtin import SplitRows
    from kernellab.agents.builtin.planner import modelled_time

    p = Problem("split_rows_case", src)
    code = build(p)
    assert "'SPLIT_R': " in code.source and "ws = [torch.empty((nrows, sp)" in code.source
    assert not [x for x in applicable_actions(p) if isinstance(x.action, SplitRows)]
    # the seed's split is the model's too: one program a row (SPLIT_R=1, what the seed ran before) models slower
    from kernellab.search._tune import flatten_space, parse_space, read_space

    space, config = read_space(code.source)
    gid = next(g for g, c in config.items() if "SPLIT_R" in c)
    unsplit = build(p, [SplitRows(gid, 1)])
    assert "'SPLIT_R': " not in unsplit.source and modelled_time(p, unsplit) > 1.5 * modelled_time(p, code)
    _check(p, code.source, "the split seed", trials=3)
    # one row (the loss) is cut in 1024: in 256 it ran as 128 programs, under one an SM; both cost models count it
    assert config[gid]["SPLIT_R"] == (1024 if src == LOSS else 256)
    from kernellab.agents.builtin import modelled

    assert modelled.modelled_ms(p, config={gid: {**config[gid], "SPLIT_R": 1}}).ms > 1.5 * modelled.modelled_ms(p).ms
    # the tuner may turn it off again: SPLIT_R=1 takes the one-program-a-row path
    assert 1 in space[gid]["SPLIT_R"] and config[gid]["SPLIT_R"] in space[gid]["SPLIT_R"] and config[gid]["SPLIT_R"] > 1
    parse_space(*flatten_space(space, config))
    result = sandbox.evaluate(p, code.source, config={gid: {"SPLIT_R": 1}}, small=True, device="cpu", trials=2,
                              timing=False)
    assert result["status"] == "correct", result["error_text"]


def test_bad_candidate_is_refused():
    with pytest.raises(ValueError, match="action list"):
        applicable_actions(_problem("ops/softmax"), {"meta": {}})


# -- the same on the GPU at full size (the lead runs these); four trials reach the sandbox's "mixed"
# distribution (magnitudes 1e-3..10), the hardest for a reordered fp32 sum (split-K) and for 3xTF32 ---

# two problems in every GPU call (a fused tf32x3 GEMM, a 16384-long softmax: one-pass at MAX_R 32768);
# the others on demand
GPU_EVERY = ["fusions/gemm_bias_gelu", "ops/softmax"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in GPU_EVERY else pytest.mark.gpu_slow)
                                  for n in WIDE + NARROW])
def test_children_correct_on_gpu_at_full_size(name):
    acts = _children(_problem(name), device="cuda", trials=4)
    if name in WIDE:
        assert len(acts) >= 4


@pytest.mark.gpu
@pytest.mark.gpu_slow
@pytest.mark.parametrize("name", ["fusions/gemm_bias_gelu", "ops/softmax", "fusions/scaled_bias_softmax"])
def test_chains_on_gpu_at_full_size(name):
    assert len(_walk(_problem(name), 3, device="cuda", trials=4)) == 3


def test_the_planner_role_expands_three_levels():
    """BuiltinAgents.plan over a growing tree (each child correct, selected next): at least four
    proposals from the seed, none repeated, and new sources three levels down."""
    from kernellab.agents.builtin import BuiltinAgents

    p = _problem("fusions/linear_softmax")
    agents = BuiltinAgents()
    code = build(p)
    tree = [{"id": "n0", "parent_id": None, "meta": code.meta, "selected": True,
             "best": {"status": "correct", "speedup_eager": 1.0}}]
    hashes = {_hash(code.source)}
    first = agents.plan(p, tree, 8, {})
    assert len(first) >= 4 and len({repr(x.action) for x in first}) == len(first)
    for depth in range(1, 4):
        props = agents.plan(p, tree, 8, {})
        parent = tree[-1]
        child = next(c for c in (agents.code(p, x, parent) for x in props) if _hash(c.source) not in hashes)
        hashes.add(_hash(child.source))
        _check(p, child.source, child.action)
        for r in tree:
            r["selected"] = False
        tree.append({"id": f"n{depth}", "parent_id": parent["id"], "meta": child.meta, "selected": True,
                     "best": {"status": "correct", "speedup_eager": 1.0}})
        assert len(child.meta["actions"]) == depth


@pytest.mark.gpu
@pytest.mark.parametrize("src", [LOSS, ROWMAX], ids=["mse_loss", "row_max_sum"])
def test_split_reduction_on_gpu_at_full_size(src):
    p = Problem("split_rows_case", src)
    code = build(p)
    assert "'SPLIT_R': " in code.source
    _check(p, code.source, "split reduction", device="cuda", trials=4)
