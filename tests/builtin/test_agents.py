"""The rule-based roles, actions and replay, on small real problems (no mocks of our components)."""

from __future__ import annotations

import pytest
import torch

from kernellab.agents.builtin import (
    BuiltinAgents,
    KeepRowOut,
    LibraryGemm,
    Persistent,
    Precision,
    ReductionMode,
    SetConfig,
    Split,
    SplitK,
    SplitRows,
    ToTorch,
    action_from_dict,
    build,
    built,
    seed,
)
from kernellab.agents.builtin.actions import ACTIONS, Fuse
from kernellab.agents.roles import Agents, Proposal
from kernellab.problem import Problem

LINEAR_SOFTMAX = '''import torch

batch = 64
k = 256
n = 512
SMALL = {"batch": 5, "k": 16, "n": 33}


class Model(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.linear = torch.nn.Linear(k, n)

    def forward(self, x):
        return torch.softmax(self.linear(x) * 0.5, dim=-1)


def get_inputs():
    return [torch.randn(batch, k)]


def get_init_inputs():
    return [k, n]
'''

LAYERNORM = LINEAR_SOFTMAX.replace("torch.softmax(self.linear(x) * 0.5, dim=-1)",
                                   "torch.nn.functional.layer_norm(torch.relu(x) + 1.0, (x.shape[-1],))")


@pytest.fixture(scope="module")
def gemm_problem():
    return Problem("linear_softmax", LINEAR_SOFTMAX)


@pytest.fixture(scope="module")
def rows_problem():
    return Problem("relu_layernorm", LAYERNORM)


def row(code, cid="c1", parent=None, status="correct", speed=1.2, selected=True, analysis=None):
    return {"id": cid, "parent_id": parent, "source": code.source, "meta": code.meta, "selected": selected,
            "best": {"status": status, "speedup_eager": speed}, "analysis": analysis}


def test_protocol():
    agents = BuiltinAgents()
    assert isinstance(agents, Agents)
    assert agents.name == "builtin"


def test_every_action_round_trips():
    samples = [Split("n1"), Fuse("n1"), ToTorch("n1"), LibraryGemm("*"), KeepRowOut("g"), ReductionMode("g", "multi_pass"),
               SplitK("g", 4), SplitRows("g", 16), Persistent("g"), Precision("g", "tf32x3"),
               SetConfig("g", (("BLOCK_M", 64), ("num_stages", 2)), "smaller tiles")]
    assert {a.kind for a in samples} == set(ACTIONS)
    for a in samples:
        assert action_from_dict(a.to_dict()) == a
        assert a.describe()
    with pytest.raises(ValueError):
        action_from_dict({"kind": "teleport"})
    with pytest.raises(ValueError):
        ReductionMode("g", "sideways")


def test_build_is_deterministic_and_records_actions(gemm_problem):
    gid = built(gemm_problem).groups[-1].id
    acts = [SetConfig(gid, (("GROUP_M", 1),), "tile ordering")]
    a, b = build(gemm_problem, acts), build(gemm_problem, [x.to_dict() for x in acts])
    assert a.source == b.source
    assert a.meta["actions"] == [acts[0].to_dict()]
    assert "'GROUP_M': 1" in a.source and a.source != build(gemm_problem).source


def test_a_config_the_planner_sets_stays_inside_the_space(gemm_problem):
    """The tile-ordering action sets GROUP_M=16, which the GEMM's SPACE did not list: the tuner refused
    such candidates (SpaceError), so the value is added to the candidate's SPACE."""
    from kernellab.search._tune import flatten_space, parse_space, read_space

    gid = built(gemm_problem).groups[-1].id
    code = build(gemm_problem, [SetConfig(gid, (("GROUP_M", 16),), "tile ordering")])
    space, config = read_space(code.source)
    assert config[gid]["GROUP_M"] == 16 and 16 in space[gid]["GROUP_M"]
    parse_space(*flatten_space(space, config))  # raised SpaceError before: the default was outside the space


MATMUL = """import torch

m = 64
k = 4096
n = 64
SMALL = {"m": 5, "k": 16, "n": 33}


class Model(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(m, k), torch.randn(k, n)]


def get_init_inputs():
    return []
"""


def test_plan_on_empty_tree_proposes_seeds(gemm_problem):
    # two fp32 inputs, K = 4096, default tolerances: only IEEE dots fit, so the cuBLAS variant is a
    # second seed
    mm = Problem("matmul", MATMUL)
    props = BuiltinAgents().plan(mm, [], 4, {})
    assert props[0].parent_id is None and props[0].action is None
    assert props[1].action == LibraryGemm("*").to_dict()
    assert len(seed(mm)) == 2
    # a Linear layer: its weight keeps the error of 3xTF32 inside 1e-4, the seed uses it, one seed
    assert len(BuiltinAgents().plan(gemm_problem, [], 4, {})) == 1
    assert len(seed(gemm_problem)) == 1 and 'input_precision="tf32x3"' in seed(gemm_problem)[0].source


def test_plan_does_not_expand_library_only_nodes():
    mm = Problem("matmul", MATMUL)
    kern = row(build(mm), cid="k1", speed=0.8, selected=False)
    lib = row(build(mm, [LibraryGemm("*")]), cid="l1", speed=1.0)
    lib["best"]["library_only"] = True
    props = BuiltinAgents().plan(mm, [kern, lib], 3, {})
    assert props and all(p.parent_id == "k1" for p in props)
    # cuBLAS for everything and nothing else: no child of it runs a kernel of ours
    assert BuiltinAgents().plan(mm, [lib], 3, {}) == []


CONV = """import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(2, 3, 10, 10)]


def get_init_inputs():
    return []
"""


def test_plan_puts_our_own_conv_in_a_library_only_conv_seed():
    """A conv with nothing after it: on the GPU the seed returns cuDNN's output (library-only). Its children are
    our own conv at pinned precisions, not tuning variants of a conv kernel that never ran."""
    p = Problem("conv_only", CONV)
    seed_row = row(build(p), cid="s", speed=1.0)
    seed_row["best"]["library_only"] = True
    (gid,) = [g.id for g in built(p).groups if g.kind == "conv"]
    props = BuiltinAgents().plan(p, [seed_row], 4, {})
    assert props and all(p_.parent_id == "s" for p_ in props)
    assert {(a.action["kind"], a.action["group"]) for a in props} == {("precision", gid)}
    assert "tf32rn" in {a.action["precision"] for a in props}
    # a node that runs kernels of its own is expanded with every action, as before
    seed_row["best"]["library_only"] = False
    kinds = {a.action["kind"] for a in BuiltinAgents().plan(p, [seed_row], 8, {})}
    assert "precision" in kinds and kinds != {"precision"}


def test_plan_expands_selected_node_without_repeating(gemm_problem):
    agents = BuiltinAgents()
    parent = row(build(gemm_problem))
    props = agents.plan(gemm_problem, [parent], 3, {})
    assert props and all(p.parent_id == "c1" and p.action for p in props)
    assert props == sorted(props, key=lambda p: -p.expected_gain)
    child = agents.code(gemm_problem, props[0], parent)
    assert child.meta["actions"] == [props[0].action]
    tried = row(child, cid="c2", parent="c1", selected=False)
    again = agents.plan(gemm_problem, [parent, tried], 3, {})
    assert props[0].action not in [p.action for p in again]


def test_plan_uses_reference_profile_shares(rows_problem):
    agents = BuiltinAgents()
    parent = row(build(rows_problem))
    props = agents.plan(rows_problem, [parent], 2, {"ops": [{"name": "aten::layer_norm", "ms": 1.0, "share": 1.0}]})
    for p in props:
        assert "100%" in p.rationale


def test_code_replays_parent_plus_one_action(rows_problem):
    agents = BuiltinAgents()
    parent = row(build(rows_problem))
    gid = next(g.id for g in built(rows_problem).groups if g.kind == "rows")
    prop = Proposal("c1", "two-pass", action=ReductionMode(gid, "multi_pass").to_dict())
    code = agents.code(rows_problem, prop, parent)
    assert code.meta["actions"] == [prop.action]
    assert "'mode': 'multi_pass'" in code.source
    with pytest.raises(ValueError):
        agents.code(rows_problem, prop, {"id": "x", "meta": {}, "source": "# written by hand"})


def test_debug_out_of_resources_shrinks_tiles(gemm_problem):
    code = build(gemm_problem)
    gid = built(gemm_problem).groups[-1].id
    ev = {"status": "compile_error", "error_text": f"triton.runtime.errors.OutOfResources: out of resource: "
                                                   f"shared memory, Required: 262144 (in {gid}_kernel)"}
    fix = BuiltinAgents().debug(gemm_problem, row(code), ev)
    assert fix.source and "smaller tiles" in fix.diagnosis
    assert fix.meta["actions"][-1]["kind"] == "set_config"
    assert dict(fix.meta["actions"][-1]["values"])["BLOCK_M"] == 64


def test_debug_mismatch_walks_the_precision_ladder(gemm_problem):
    agents = BuiltinAgents()
    code = build(gemm_problem)
    seen = []
    for _ in range(3):
        fix = agents.debug(gemm_problem, row(code, status="incorrect"), {"status": "incorrect", "error_text": "max abs err 0.3"})
        assert fix.source is not None
        seen.append(fix.meta["actions"][-1]["kind"])
        code = build(gemm_problem, fix.meta["actions"])
    # the seed runs 3xTF32 (a Linear weight): IEEE dots first, then two-pass rows / unfused row reduction
    assert seen[0] == "precision" and seen[1] in ("keep_row_out", "reduction_mode")
    assert len(set(seen)) == 3


def test_debug_compile_error_splits_the_named_group(rows_problem):
    b = built(rows_problem)
    grp = next(g for g in b.groups if g.kind == "rows")
    ev = {"status": "compile_error", "error_text": f"CompilationError at k_{grp.id}_one: unsupported"}
    fix = BuiltinAgents().debug(rows_problem, row(build(rows_problem)), ev)
    last = fix.meta["actions"][-1]
    assert last["kind"] == "split" and last["node"] in grp.nodes
    after = built(rows_problem, fix.meta["actions"])
    assert len([g for g in after.groups if g.kind != "torch"]) > len([g for g in b.groups if g.kind != "torch"])


def test_debug_gives_up_on_foreign_candidates(rows_problem):
    fix = BuiltinAgents().debug(rows_problem, {"id": "x", "meta": {}, "source": ""}, {"status": "incorrect"})
    assert fix.source is None


def test_analyze_from_counted_bytes(rows_problem):
    code = build(rows_problem)
    a = BuiltinAgents().analyze(rows_problem, row(code), {"status": "correct", "median_ms": 0.01}, [])
    # 64 x 256 fp32 in and out = 131 kB in 10 us = 13 GB/s: far below both ceilings
    assert a.bound == "latency" and a.pct_of_ceiling is not None and a.pct_of_ceiling < 30
    assert "MB" in a.evidence and a.next_ideas
    fast = BuiltinAgents().analyze(rows_problem, row(code), {"status": "correct", "median_ms": 0.00004}, [])
    assert fast.bound == "memory" and fast.pct_of_ceiling > 50
    interp = BuiltinAgents().analyze(rows_problem, row(code), {"status": "correct", "median_ms": 3.0,
                                                               "interpreted": True}, [])
    assert interp.bound == "unknown"


def test_analyze_from_ncu_metrics(gemm_problem):
    code = build(gemm_problem)
    metrics = [{"kernel": "k", "name": "duration_ns", "value": 1000.0},
               {"kernel": "k", "name": "dram_throughput_pct", "value": 20.0},
               {"kernel": "k", "name": "sm_throughput_pct", "value": 85.0},
               {"kernel": "k", "name": "local_load_instructions", "value": 12.0}]
    a = BuiltinAgents().analyze(gemm_problem, row(code), {"status": "correct", "median_ms": 0.001}, metrics)
    assert a.bound == "compute" and a.pct_of_ceiling == 85.0
    assert "spills" in a.evidence and any("smaller tiles" in i for i in a.next_ideas)


def test_profile_reference_on_cpu(rows_problem):
    from kernellab.agents.builtin import profile_reference

    prof = profile_reference(rows_problem, device="cpu", reps=2)
    assert prof["ops"] and abs(sum(o["share"] for o in prof["ops"]) - 1.0) < 1e-2
    assert all(o["name"].startswith("aten::") for o in prof["ops"])
    assert torch.is_grad_enabled()
