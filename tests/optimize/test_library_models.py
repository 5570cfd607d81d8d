"""Whole models as model libraries write them: blocks called with keyword and constant arguments and
returning tuples with None (kwargs_model.py, plain torch: always runs), a transformers BERT and a timm
ResNet from experiments/models/library.py (random weights: their code, our kernels) through
``kernellab.optimize`` end to end, skipped where the library is not installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kernellab import wholemodel as opt

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
LIB = "experiments.models.library"
sys.path.insert(0, str(ROOT))  # experiments.models, as the CLI finds it from the checkout


def _need(name: str) -> None:
    try:
        __import__(name)
    except ImportError as exc:  # timm without torchvision is an ImportError of its own
        pytest.skip(f"{name} is not importable here ({exc}): pip install -e '.[models]'")


def _count_runs(fast) -> list:
    calls: list = []
    fast.module.register_forward_hook(lambda *a: calls.append(1))
    return calls


def test_keyword_and_constant_arguments_become_one_problem_of_tensors() -> None:
    model, inputs, _ = opt.load_model_spec(str(HERE / "kwargs_model.py"), device="cpu")
    units = opt.split(model, max_heavy=1)
    assert [u.label for u in units] == ["blocks.0", "blocks.1"]
    prof = opt.profile_units(model, inputs, units)
    tasks, skipped = opt.make_tasks("kw", units, prof)
    assert not skipped  # before: "called with keyword or non-tensor arguments", both left to PyTorch
    (task,) = tasks
    assert [u.label for u in task.units] == ["blocks.0", "blocks.1"]
    # the problem takes the call's two tensors (x, then the mask keyword) and returns the hidden state
    x, mask = inputs
    assert task.signature == ((tuple(x.shape), "float32"), (tuple(mask.shape), "bool"))
    assert "mask" in task.call and "0.5" in task.call
    assert task.out["tensors"] == 1 and [tuple(c) for c in task.out["consts"]] == [(1, None)]
    ref = task.problem.module().Model()
    with torch.no_grad():
        torch.testing.assert_close(ref(x, mask), model.blocks[0](x, mask=mask, cache=None, scale=0.5)[0])
    # another constant is another problem
    other = opt.tracing._flat_call((x,), {"mask": mask, "cache": None, "scale": 0.25})
    assert other[1] == task.signature and other[2] != task.call


class _Cache:
    """A cache object, as a decoder passes one: not a constant export can bake in."""


class _CacheNet(torch.nn.Module):
    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block, self.head = block, torch.nn.Linear(block.fc.out_features, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x, cache=_Cache())[0])


def test_a_call_with_an_object_argument_stays_pytorch_and_says_why() -> None:
    model, inputs, _ = opt.load_model_spec(str(HERE / "kwargs_model.py"), device="cpu")
    net = _CacheNet(model.blocks[0])
    units = opt.split(net, max_heavy=1)
    tasks, skipped = opt.make_tasks("cache", units, opt.profile_units(net, inputs[:1], units))
    assert [t.units[0].label for t in tasks] == ["head"] and [s["unit"] for s in skipped] == ["block"]
    assert "neither a tensor nor None/bool/int/float/str" in skipped[0]["reason"]


@pytest.fixture(scope="module")
def kw_optimized(tmp_path_factory):
    db = tmp_path_factory.mktemp("kw") / "k.db"
    model, inputs, name = opt.load_model_spec(str(HERE / "kwargs_model.py"), device="cpu")
    r = opt.optimize(model, inputs, db=str(db), name=name, budget=2, max_heavy=1, trials=2, compare=False)
    return model, inputs, r


def test_keyword_called_blocks_run_their_winner_and_fall_back_on_other_constants(kw_optimized) -> None:
    model, inputs, r = kw_optimized
    (row,) = r["problems"]
    assert row["patched"] == ["blocks.0", "blocks.1"], row
    assert r["check"]["ok"] and r["check"]["mode"] == "train"
    patched = r["model"]
    fast = patched.blocks[0].__dict__["_kernellab_fast"]
    runs = _count_runs(fast)
    x, mask = opt.fresh_inputs(inputs, 5)
    with torch.no_grad():
        got = patched.blocks[0](x, mask=mask, cache=None, scale=0.5)
        want = model.blocks[0](x, mask=mask, cache=None, scale=0.5)
        assert len(runs) == 1
        # the unit's own output structure, rebuilt around the winner's tensor
        assert isinstance(got, tuple) and got[1] is None
        torch.testing.assert_close(got[0], want[0], atol=1e-3, rtol=1e-3)
        # a constant, a keyword or a None the winner was not judged with: PyTorch's forward
        for kwargs in ({"mask": mask, "cache": None, "scale": 0.25}, {"mask": mask, "scale": 0.5},
                       {"mask": None, "cache": None, "scale": 0.5}):
            torch.testing.assert_close(patched.blocks[0](x, **kwargs)[0], model.blocks[0](x, **kwargs)[0])
        assert len(runs) == 1
        torch.testing.assert_close(patched(x, mask), model(x, mask), atol=1e-3, rtol=1e-3)
        assert len(runs) == 2


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    _need("transformers")
    db = tmp_path_factory.mktemp("bert") / "k.db"
    model, inputs, name = opt.load_model_spec(f"{LIB}:hf_bert", f"{LIB}:hf_bert_inputs", device="cpu")
    # two campaigns of two candidates: the attention's among them whatever the (noisy, shared-CPU) ranking
    # puts beside it
    r = opt.optimize(model, inputs, db=str(db), name=name, budget=4, per_problem=2, max_heavy=4, trials=2)
    return model, inputs, r


def test_transformers_bert_end_to_end(bert) -> None:
    from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions as Out

    model, inputs, r = bert
    assert not model.training and r["check"]["mode"] == "eval"
    rows = {tuple(p["units"]): p for p in r["problems"]}
    attention = ("encoder.layer.0.attention", "encoder.layer.1.attention")
    # the attention, called with the padding mask and keyword constants, is a problem (before: skipped),
    # among the two hottest; its two equal layers one campaign, its winner patched into both
    summary = [(p["units"], round(p["share"], 3), p["outcome"]) for p in r["problems"]]
    assert attention in [tuple(p["units"]) for p in r["problems"][:2]], summary
    assert rows[attention]["outcome"] == "ran" and rows[attention]["patched"] == list(attention), summary
    assert r["check"]["ok"] and r["check"]["trials"] == 3
    assert r["timing"]["interpreted"] and r["patched_share"] > 0 and r["covered_share"] is None
    assert not r["skipped"]
    patched = r["model"]
    runs = _count_runs(patched.encoder.layer[0].attention.__dict__["_kernellab_fast"])
    ids, mask = inputs
    with torch.no_grad():
        got, want = patched(ids, mask), model(ids, mask)
        assert isinstance(got, Out) and len(runs) == 1
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=1e-3, rtol=1e-3)
        # no padding: transformers passes no mask to the attention, a call the winner was not judged on
        ones = torch.ones_like(mask)
        torch.testing.assert_close(patched(ids, ones).last_hidden_state, model(ids, ones).last_hidden_state)
        assert len(runs) == 1
    # training mode (dropout) is another mode: PyTorch
    patched.train()
    with torch.no_grad():
        patched(ids, mask)
    assert len(runs) == 1


@pytest.mark.slow  # 2-4 minutes: the ResNet's convolutions in the Triton interpreter
def test_timm_resnet_end_to_end(tmp_path) -> None:
    _need("timm")
    model, inputs, name = opt.load_model_spec(f"{LIB}:timm_resnet", f"{LIB}:timm_resnet_inputs", device="cpu")
    r = opt.optimize(model, inputs, db=str(tmp_path / "k.db"), name=name, budget=2, max_heavy=4, trials=2,
                     compare=False)
    assert type(model).__module__.startswith("timm.") and not model.training
    assert r["check"]["ok"] and r["check"]["mode"] == "eval"
    assert any(p["patched"] for p in r["problems"])
    x = opt.fresh_inputs(inputs, 3)
    with torch.no_grad():
        torch.testing.assert_close(r["model"](*x), model(*x), atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.gpu_slow  # a full-size model's campaigns: minutes
@pytest.mark.parametrize("factory", ["hf_bert", "timm_resnet"])
def test_library_model_on_the_gpu(factory, tmp_path) -> None:
    """bert-base (8x128 tokens) and resnet18 (8x3x224x224) at full size on CUDA: correct end to end,
    timed against eager and torch.compile; the BERT attention is a problem of its own, not skipped."""
    _need("transformers" if factory == "hf_bert" else "timm")
    model, inputs, name = opt.load_model_spec(f"{LIB}:{factory}", f"{LIB}:{factory}_inputs", device="cuda")
    r = opt.optimize(model, inputs, db=str(tmp_path / "k.db"), name=name, budget=8, time_budget_s=240,
                     max_heavy=4, trials=3, device="cuda")
    assert r["check"] is None or r["check"]["ok"], r["check"]
    t = r["timing"]
    assert not t["interpreted"] and t["compile"]["median_ms"] > 0 and t["speedup_vs_compile"] > 0
    if factory == "hf_bert":  # the 12 equal attention layers, called with keywords, are one problem
        rows = {p["units"][0]: p for p in r["problems"]}
        assert len(rows["encoder.layer.0.attention"]["units"]) == 12
        assert not [s for s in r["skipped"] if s["unit"].endswith("attention")], r["skipped"]
    for p in r["problems"]:
        if p["patched"]:
            assert p["winner"]["speedup_eager"] >= opt.MIN_PATCH_SPEEDUP
