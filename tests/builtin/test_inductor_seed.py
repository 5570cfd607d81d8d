"""The Inductor seed: torch.compile's own generated code wrapped as a candidate (kernellab/agents/builtin/inductor.py).

On the CPU, Inductor's Triton backend (``cpu_backend = "triton"``) writes the kernels and its runtime runs
them in the interpreter, so the seed is generated and judged by the real sandbox here; the GPU tests check
the same on CUDA with the own-kernel share measured from the profiled launches.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest
import torch

from kernellab.agents.builtin import BuiltinAgents
from kernellab.agents.builtin.inductor import InductorSeedError, inductor_seed
from kernellab.problem import Problem, instantiate, load_problem
from kernellab.sandbox import evaluate

ROOT = Path(__file__).resolve().parents[2]
LINEAR_RELU = ROOT / "tests" / "export" / "linear_relu.py"
CONV_BIAS = ROOT / "tests" / "problems" / "kb_conv_bias_relu.py"
CONV_BN_TRAIN = ROOT / "tests" / "problems" / "kb_conv_bn_train.py"
GEMM_ADD_RELU = ROOT / "tests" / "problems" / "kb_gemm_add_relu.py"
GEMM_BIAS_GELU = ROOT / "experiments" / "problems" / "fusions" / "gemm_bias_gelu.py"  # bundled; erf in a kernel

cpu_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                              reason="the CPU path runs Inductor's Triton kernels in the interpreter (TRITON_INTERPRET=1)")


@functools.cache
def _seed(path: Path, device: str = "cpu"):
    return inductor_seed(load_problem(path), device)


def _assert_eager_conv_layout(source: str) -> None:
    """Inductor's conv reads the input and the weight as handed to call(), eager's layout: with its layout
    optimization on, it first copies them channels-last (into buffers, by Triton kernels), and cuDNN's
    TF32 conv then differs from eager's NCHW one by ~1e-3 on the GPU."""
    convs = re.findall(r"extern_kernels\.convolution\((\w+), (\w+),", source)
    assert convs and all(re.fullmatch(r"arg\d+_1", a) and re.fullmatch(r"arg\d+_1", w) for a, w in convs), convs


@cpu_only
def test_linear_relu_seed_is_correct_in_the_sandbox_with_its_kernels_counted() -> None:
    code = _seed(LINEAR_RELU)
    meta = code.meta["inductor"]
    assert code.origin == "inductor"
    # the placeholders' order puts the weights before the input: a guessed (input-first) order is wrong
    assert meta["args"] == ["param:linear.weight", "param:linear.bias", "input:0"]
    assert meta["triton_kernels"] and "addmm" in meta["extern"]
    r = evaluate(load_problem(LINEAR_RELU), code.source, trials=2, timing=False)
    assert r["status"] == "correct", (r["error_class"], r["error_text"])
    assert not r["library_only"] and r["own_kernel_share"] > 0
    assert set(r["details"]["own_kernels"]) == set(meta["triton_kernels"])


@cpu_only
@pytest.mark.parametrize("path", [CONV_BIAS, GEMM_BIAS_GELU], ids=lambda p: p.stem)
def test_conv_bias_and_bundled_gemm_gelu_seeds_are_correct_in_the_sandbox(path: Path) -> None:
    code = _seed(path)
    if path == CONV_BIAS:  # the graph's order: neither inputs first nor parameters first
        assert code.meta["inductor"]["args"] == ["param:conv.weight", "param:conv.bias", "input:0", "param:bias"]
        _assert_eager_conv_layout(code.source)
    else:  # the interpreter has no libdevice: erf runs as tl.math's
        assert code.meta["inductor"]["libdevice_as_tl_math"] == ["erf"]
    r = evaluate(load_problem(path), code.source, trials=2, timing=False)
    assert r["status"] == "correct", (r["error_class"], r["error_text"])
    assert not r["library_only"]


@cpu_only
def test_training_batchnorm_seed_updates_the_running_statistics(load) -> None:
    problem = load_problem(CONV_BN_TRAIN)
    code = _seed(CONV_BN_TRAIN)
    assert "buffer:bn.running_mean" in code.meta["inductor"]["args"]
    r = evaluate(problem, code.source, trials=2, timing=False)
    assert r["status"] == "correct", (r["error_class"], r["error_text"])
    # the candidate writes the batch statistics into the module's own buffers, as the reference does
    mod = load(code.source)
    ref = instantiate(problem, small=True, seed=0, device="cpu")
    new = instantiate(problem, small=True, seed=0, device="cpu", model_cls=mod.ModelNew)
    with torch.no_grad():
        for _ in range(2):
            expect, got = ref.model(*ref.inputs), new.model(*ref.inputs)
    torch.testing.assert_close(got, expect, atol=1e-4, rtol=1e-4)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        before = getattr(instantiate(problem, small=True, seed=0, device="cpu").model.bn, name)
        assert not torch.equal(getattr(new.model.bn, name), before), name
        torch.testing.assert_close(getattr(new.model.bn, name), getattr(ref.model.bn, name), atol=1e-5, rtol=1e-5)


@cpu_only
def test_inductor_launches_are_recorded_by_the_launch_counter(load) -> None:
    # on a GPU Inductor launches through CachingAutotuner.run, never JITFunction.run: the worker hooks it
    from kernellab.sandbox._guard import LaunchCounter

    code = _seed(LINEAR_RELU)
    mod = load(code.source)
    counter = LaunchCounter(hooks=False)
    assert counter.hook_inductor()
    inst = instantiate(load_problem(LINEAR_RELU), small=True, seed=0, device="cpu", model_cls=mod.ModelNew)
    counter.armed = True
    try:
        with torch.no_grad():
            inst.model(*inst.inputs)
    finally:
        counter.armed = False
    assert counter.names == set(code.meta["inductor"]["triton_kernels"]) and counter.launches >= 1


def test_a_graph_break_is_a_reason_not_a_candidate(tmp_path: Path) -> None:
    src = ("import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
           "        if x.sum() > 0:  # data-dependent control flow: two graphs\n            return x * 2\n"
           "        return x - 1\n\ndef get_inputs():\n    return [torch.randn(8, 8)]\n\n"
           "def get_init_inputs():\n    return []\n")
    with pytest.raises(InductorSeedError, match="torch.compile failed|graph"):
        inductor_seed(Problem(name="branchy", source=src), "cpu")


def test_a_bad_device_is_refused() -> None:
    with pytest.raises(InductorSeedError, match="not cpu or cuda"):
        inductor_seed(load_problem(LINEAR_RELU), "tpu")


def test_the_planner_expands_a_builtin_node_when_the_inductor_seed_is_selected() -> None:
    # greedy selects the best node, often the Inductor seed, which has no action list to replay: before,
    # the planner proposed nothing and the problem stopped after its seeds
    problem = load_problem(LINEAR_RELU)
    ok = {"status": "correct", "speedup_eager": 2.0, "library_only": False}
    tree = [{"id": "ind", "parent_id": None, "selected": True, "meta": {"inductor": {}}, "best": ok},
            {"id": "seed", "parent_id": None, "selected": False, "meta": {"actions": []},
             "best": {**ok, "speedup_eager": 1.0}}]
    props = BuiltinAgents().plan(problem, tree, 2, {})
    assert props and all(p.parent_id == "seed" for p in props)


@cpu_only
def test_the_inductor_seed_joins_the_first_round_whose_plan_finds_it_compiled() -> None:
    """Waiting for its compile in the first round held a solo campaign's first results 16-21 s on the H200:
    a compile under way leaves the first round to the builtin seeds and makes the seed the second round's
    first proposal (the same candidates as before); compiled already, it is a first-round seed. Once."""
    problem = load_problem(LINEAR_RELU)
    ind = {"kind": "inductor_seed"}
    off = BuiltinAgents().plan(problem, [], 4, {})
    assert not any(p.action == ind for p in off)
    agents = BuiltinAgents(inductor={"device": "cpu", "small": True})
    agents.prefetch([problem])  # a child process: its imports alone take longer than this plan
    first = agents.plan(problem, [], 4, {})
    assert [p.idea for p in first] == [p.idea for p in off]
    ok = {"status": "correct", "speedup_eager": 1.0, "library_only": False}
    tree = [{"id": "seed", "parent_id": None, "selected": True, "origin": "builtin", "meta": {"actions": []},
             "best": ok}]
    second = agents.plan(problem, tree, 3, {})
    assert second[0].action == ind and len(second) == 3 and all(p.parent_id == "seed" for p in second[1:])
    assert not any(p.action == ind for p in agents.plan(problem, tree, 3, {}))  # proposed once
    agents._seeds[problem.id].result()  # the prefetched compile, to its end
    ready = BuiltinAgents(inductor={"device": "cpu", "small": True})
    ready._seeds[problem.id] = agents._seeds[problem.id]
    on = ready.plan(problem, [], 4, {})
    assert len(on) == len(off) + 1 and on[1].action == ind
    # where the first round's seeds would use up k (a GEMM needing IEEE dots: the builtin and the cuBLAS seeds, on
    # a budget of 2), it is among them, compiled or not, as before (the code step waits for the rest of it)
    gemm = load_problem(Path(__file__).resolve().parents[1] / "sandbox" / "problems" / "square_matmul.py")
    assert len(BuiltinAgents().plan(gemm, [], 4, {})) == 2
    tight = BuiltinAgents(inductor={"device": "cpu", "small": True})
    assert [p.action for p in tight.plan(gemm, [], 2, {})] == [None, ind]
    # a resumed campaign's tree that has it already: not proposed again
    grown = tree + [{"id": "ind", "parent_id": None, "selected": False, "origin": "inductor",
                     "meta": {"inductor": {}}, "best": ok}]
    assert not any(p.action == ind for p in BuiltinAgents(inductor={"device": "cpu", "small": True}).plan(
        problem, grown, 3, {}))


def test_a_dynamo_disable_wrapper_of_manual_seed_is_no_patch_but_another_wrapper_is() -> None:
    # a candidate running Inductor's code imports torch._dynamo, which wraps torch.manual_seed: on the CPU
    # the sandbox rejected every Inductor seed as `torch_patched` before
    from kernellab.sandbox._guard import StateSnapshot

    orig = torch.manual_seed
    try:
        base = getattr(orig, "__wrapped__", orig)
        torch.manual_seed = base
        snap = StateSnapshot()
        torch.manual_seed = torch._disable_dynamo(base)
        assert snap.diff() is None
        torch.manual_seed = base
        snap = StateSnapshot()
        torch.manual_seed = functools.wraps(base)(lambda *a, **k: base(*a, **k))
        assert snap.diff() == ("torch_patched", ["torch.manual_seed"])
        torch.manual_seed = base
        snap = StateSnapshot()
        # the same wrapper around another function is a patch
        torch.manual_seed = torch._disable_dynamo(lambda *a, **k: base(*a, **k))
        assert snap.diff() == ("torch_patched", ["torch.manual_seed"])
    finally:
        torch.manual_seed = orig


@cpu_only
def test_a_campaign_stores_the_inductor_seed_with_its_origin(tmp_path: Path) -> None:
    from kernellab.campaign import CampaignConfig, run_campaign, start_campaign
    from kernellab.store import Store

    store = Store(str(tmp_path / "k.db"))
    cfg = CampaignConfig(problems=[str(LINEAR_RELU)], budget=3, trials=2, device="cpu", inductor_seed=True)
    cid = start_campaign(store, cfg, name="inductor-seed")
    run_campaign(store, cid)
    cands = store.candidates(cid)
    ind = [c for c in cands if c["origin"] == "inductor"]
    assert len(ind) == 1 and ind[0]["parent_id"] is None
    full = [e for e in store.evaluations(candidate_id=ind[0]["id"]) if e["kind"] == "full"]
    assert full and full[0]["status"] == "correct", full
    assert any(c["origin"] == "builtin" and c["parent_id"] for c in cands), "nothing grew past the seeds"
    from kernellab import report

    html = report.render(store, cid)
    # the seed's action may hold parentheses ("torch.compile (Inductor) code, 1 Triton kernel(s)")
    assert re.search(r"From the seed \((builtin|inductor): .*?\): \d+ step\(s\)", html)


# -- GPU: the same on CUDA at full size, own-kernel share from the profiled launches --------------------------
@pytest.mark.gpu
# conv+bias+relu with tests-slow: 66 s under the suite's load (session 9), and its conv path is CONV_BN_TRAIN's
@pytest.mark.parametrize("path", [GEMM_ADD_RELU, pytest.param(CONV_BIAS, marks=pytest.mark.gpu_slow), CONV_BN_TRAIN],
                         ids=lambda p: p.stem)
def test_gpu_inductor_seed_is_correct_and_its_share_measured(path: Path) -> None:
    """Correct against the eager reference, whose fp32 convs are cuDNN TF32: the seed's convs keep eager's
    layout (Inductor's layout optimization off), so cuDNN runs eager's algorithm."""
    problem = load_problem(path)
    code = inductor_seed(problem, "cuda")
    if path != GEMM_ADD_RELU:
        _assert_eager_conv_layout(code.source)
    r = evaluate(problem, code.source, device="cuda")
    assert r["status"] == "correct", (r["error_class"], r["error_text"])
    d = r["details"]
    assert set(d["own_kernels"]) == set(code.meta["inductor"]["triton_kernels"]), d.get("kernels")
    assert not r["library_only"] and r["own_kernel_share"] > 0, d.get("kernels")
    # the profiled kernels marked own are Inductor's Triton kernels, the library ones are not
    assert any(k["own"] for k in d["kernels"])
    assert all(k["name"] in code.meta["inductor"]["triton_kernels"] for k in d["kernels"] if k["own"])


@pytest.mark.gpu
def test_gpu_inductor_seed_through_the_executors_gate_is_correct() -> None:
    """The seed as a campaign makes it: admitted and sharing the GPU through ``LocalExecutor.profiling``, pinned
    to the gate's GPU; the lock is free after it."""
    from kernellab.sandbox import LocalExecutor

    problem = load_problem(GEMM_ADD_RELU)
    ex = LocalExecutor()
    try:
        code = inductor_seed(problem, "cuda", gate=ex.profiling)
        lock = next(iter(ex._gpu_locks.values()))
        assert lock._readers == 0 and not lock._writer
        r = evaluate(problem, code.source, device="cuda", executor=ex)
    finally:
        ex.shutdown()
    assert r["status"] == "correct", (r["error_class"], r["error_text"])
    assert code.meta["inductor"]["triton_kernels"]


def test_the_flag_turns_the_seed_on_and_off() -> None:
    from click.testing import CliRunner

    from kernellab.campaign import CampaignConfig, make_agents
    from kernellab.cli import main

    def agents(**kw):
        return make_agents(CampaignConfig(problems=["p.py"], device="cpu", **kw), None, "c")

    assert agents().inductor is None  # on the CPU: off unless asked
    assert agents(inductor_seed=True).inductor == {"device": "cpu", "small": None}
    assert agents(inductor_seed=False).inductor is None
    out = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--inductor-seed / --no-inductor-seed" in out


@cpu_only
def test_the_seed_is_compiled_ahead_when_prefetched() -> None:
    from kernellab.agents.builtin.inductor import inductor_proposal

    problem = load_problem(LINEAR_RELU)
    agents = BuiltinAgents(inductor={"device": "cpu", "small": True})
    agents.prefetch([problem])
    fut = agents._seeds[problem.id]  # started before any plan or code step asked for it
    code = agents.code(problem, inductor_proposal(), None)
    assert fut.done() and code is fut.result() and code.origin == "inductor"
    assert problem.id not in agents._seeds  # a later ask compiles anew (a resumed code step)


@cpu_only
def test_the_seed_compiles_sharing_the_gpu_and_never_beside_a_timing(tmp_path) -> None:
    # the child ran the reference, torch.compile's kernels and the wrapped candidate at full size with no hold
    # of the GPU at all: beside other campaigns' timings. With the executor's gate it is admitted and shares the
    # GPU from building the problem to its end but for Inductor's compile (host work, GpuHold.off), when a
    # timing that waits goes; the child's GPU work after it waits for the timing's end
    import contextlib
    import threading
    import time

    from kernellab.sandbox._executor import ProfileGate
    from kernellab.sandbox._gpu import RWLock

    lock = RWLock()
    asked: list = []
    gates: list = []
    seen = {"readers": 0}

    @contextlib.contextmanager
    def gate(problem, small=False):
        asked.append((problem.name, small))
        g = ProfileGate("0", lock)
        gates.append(g)
        try:
            yield g
        finally:
            g.close()

    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen["readers"] = max(seen["readers"], lock._readers)
            time.sleep(0.005)

    timed: list[float] = []

    def timing() -> None:  # a timing that comes once the child shares the GPU
        while not lock._readers and not done.is_set():
            time.sleep(0.005)
        lock.acquire_write()
        timed.append(time.monotonic())
        lock.release_write()

    threads = [threading.Thread(target=watch), threading.Thread(target=timing)]
    for t in threads:
        t.start()
    try:
        code = inductor_seed(load_problem(LINEAR_RELU), "cpu", gate=gate)
        ended = time.monotonic()
    finally:
        done.set()
        for t in threads:
            t.join(30)
    assert asked == [(load_problem(LINEAR_RELU).name, True)]
    assert seen["readers"] == 1  # the child's share
    # the timing went while the child compiled without the share, not at the child's end as before
    assert timed and timed[0] < ended - 0.5, (timed, ended, gates[0].seconds)
    assert gates[0].seconds.get("off", 0) > 0 and gates[0].seconds.get("shared", 0) > 0, gates[0].seconds
    assert lock._readers == 0 and not lock._writer
    assert code.origin == "inductor" and code.meta["inductor"]["triton_kernels"]
    secs = code.meta["inductor"]["seconds"]  # where the seed's time went, kept with the candidate
    assert secs["off"] == gates[0].seconds["off"] and secs["total"] >= secs["off"] + secs["shared"], secs
