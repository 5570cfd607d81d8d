"""Convolutions as our own kernels: the implicit-GEMM template (``conv.py``) through the builtin
pipeline (capture -> lower -> partition -> codegen), against PyTorch in the Triton interpreter, and
KernelBench conv problems judged by the sandbox."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kernellab import sandbox
from kernellab.agents.builtin import LibraryGemm, SetConfig, action_from_dict, build, built
from kernellab.compiler.kernels.conv import ConvSpec, conv_kernel
from kernellab.problem import Problem, apply_mode, load_problem

ROOT = Path(__file__).resolve().parents[2]
# ../shared/kernelbench beside the checkout, or KERNELBENCH_DIR (the GPU host gets a copy, scripts/gpu_check.sh)
KB_DIR = Path(os.environ.get("KERNELBENCH_DIR") or ROOT.parent / "shared" / "kernelbench")


def problem(body: str, dtype: torch.dtype, consts: str = "") -> Problem:
    name = str(dtype).replace("torch.", "")
    src = f"""import torch

DTYPE = {name!r}
{consts}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
{body}


def get_inputs():
    return INPUTS()


def get_init_inputs():
    return []
"""
    return Problem(name="t", source=src)


def run(load, close, p: Problem, cases: list, dtype: torch.dtype, actions=(), kernels: int | None = None) -> None:
    """Build one candidate, then run it at each input shape against the reference."""
    code = build(p, actions)
    if kernels is not None:
        assert code.meta["kernels"] == kernels, code.meta["groups"]
    mod = load(code.source)
    for init, inputs in cases:
        torch.manual_seed(0)
        ref = apply_mode(mod.Model(*init).to(dtype), p.mode)
        torch.manual_seed(0)
        new = apply_mode(mod.ModelNew(*init).to(dtype), p.mode)
        xs = [x.to(dtype) for x in inputs]
        with torch.no_grad():
            close(new(*xs), ref(*xs), dtype)


def _conv_problem(layer: str, forward: str, shape: tuple, dtype=torch.float32, extra: str = ""):
    body = f"""        self.conv = torch.nn.{layer}
{extra}
    def forward(self, x):
{forward}"""
    consts = f"INPUTS = lambda: [torch.randn{shape}]"
    return problem(body, dtype, consts=consts)


def _inputs(*shapes):
    return [([], [torch.randn(*s)]) for s in shapes]


def _seeded_pair(mod, shape: tuple) -> tuple:
    """(the reference Model, ModelNew with the same weights, an input of ``shape``) of a candidate module."""
    torch.manual_seed(0)
    ref = mod.Model()
    torch.manual_seed(0)
    new = mod.ModelNew()
    return ref, new, torch.randn(*shape)


def _conv_group(p):
    b = built(p)
    convs = [g for g in b.groups if g.kind == "conv"]
    assert len(convs) == 1, [g.describe(b.graph) for g in b.groups]
    return b, convs[0]


# Each case: the layer, the forward, the captured input shape, then the shapes it runs at (sizes are
# read at run time: one candidate serves them all). The channel counts pick the path: >= 16 output
# channels per group use tl.dot, fewer (depthwise) the FMA path.
CASES = {
    "conv2d_strided_padded_dilated": (
        "Conv2d(3, 16, 3, stride=2, padding=2, dilation=2)",
        "        return torch.relu(self.conv(x))", (2, 3, 11, 9), [(2, 3, 11, 9), (1, 3, 8, 13)]),
    "conv2d_asymmetric_nobias": (
        "Conv2d(4, 20, (3, 2), stride=(1, 2), padding=(1, 0), bias=False)",
        "        return torch.sigmoid(self.conv(x)) * 2.0", (2, 4, 7, 8), [(2, 4, 7, 8), (3, 4, 5, 5)]),
    "conv2d_grouped": (
        "Conv2d(6, 32, 3, padding=1, groups=2)",
        "        return torch.nn.functional.gelu(self.conv(x))", (2, 6, 6, 7), [(2, 6, 6, 7)]),
    "conv2d_depthwise": (
        "Conv2d(5, 5, (3, 5), padding=(1, 2), groups=5)",
        "        return torch.nn.functional.hardswish(self.conv(x))", (2, 5, 7, 9), [(2, 5, 7, 9), (1, 5, 4, 3)]),
    "conv2d_depthwise_multiplier": (
        "Conv2d(3, 6, 3, stride=2, groups=3)",
        "        return self.conv(x).tanh()", (2, 3, 9, 9), [(2, 3, 9, 9)]),
    "conv1d": (
        "Conv1d(3, 16, 5, stride=2, padding=1, dilation=2)",
        "        return torch.nn.functional.leaky_relu(self.conv(x), 0.1)", (2, 3, 19), [(2, 3, 19), (1, 3, 12)]),
    "conv3d": (
        "Conv3d(2, 16, 3, stride=(1, 2, 2), padding=1)",
        "        return torch.nn.functional.mish(self.conv(x))", (2, 2, 4, 6, 5), [(2, 2, 4, 6, 5)]),
    "conv_transpose2d": (
        "ConvTranspose2d(4, 16, 3, stride=2, padding=1, output_padding=1)",
        "        return torch.clamp(self.conv(x), -0.3, 0.3) / 2.0", (2, 4, 5, 4), [(2, 4, 5, 4), (1, 4, 3, 6)]),
    "conv_transpose2d_grouped_dilated": (
        "ConvTranspose2d(4, 6, (3, 2), stride=(2, 3), padding=(2, 1), dilation=(2, 1), groups=2)",
        "        return torch.relu(self.conv(x))", (2, 4, 5, 4), [(2, 4, 5, 4)]),
    "conv_transpose1d": (
        "ConvTranspose1d(3, 16, 4, stride=3, padding=2, dilation=2)",
        "        return self.conv(x) * 0.5", (2, 3, 7), [(2, 3, 7), (1, 3, 4)]),
    # sub-pixel path (stride > 1, no dilation): a stride above the kernel leaves phases with no tap at all
    "conv_transpose2d_stride_over_kernel": (
        "ConvTranspose2d(4, 16, 2, stride=3, output_padding=2)",
        "        return self.conv(x) - 0.25", (2, 4, 3, 4), [(2, 4, 3, 4), (1, 4, 1, 2)]),
    "conv_transpose2d_grouped_mixed_stride": (
        "ConvTranspose2d(4, 32, (3, 4), stride=(2, 1), padding=(1, 2), groups=2)",
        "        return torch.relu(self.conv(x))", (2, 4, 5, 6), [(2, 4, 5, 6)]),
    "conv_transpose1d_subpixel": (
        "ConvTranspose1d(3, 16, 5, stride=2, padding=2, output_padding=1)",
        "        return self.conv(x)", (2, 3, 6), [(2, 3, 6), (1, 3, 1)]),
    "conv_transpose3d": (
        "ConvTranspose3d(3, 16, 3, stride=2, padding=1)",
        "        return torch.nn.functional.silu(self.conv(x))", (1, 3, 3, 4, 3), [(1, 3, 3, 4, 3)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_conv_variant_matches_torch(load, close, case):
    layer, forward, shape, shapes = CASES[case]
    p = _conv_problem(layer, forward, shape)
    b, grp = _conv_group(p)
    # the activation (and the bias add, where there is one) run in the conv's epilogue
    assert grp.epilogue, grp.describe(b.graph)
    run(load, close, p, _inputs(*shapes), torch.float32, kernels=1)


# 16 or more input channels per group: the tap-major K loop (``TAP_MAJOR``), channel blocks of 16 inside each tap;
# 20 and 24 leave a partly masked channel block
TAP_CASES = {
    "conv2d_strided_padded_dilated": ("Conv2d(20, 16, 3, stride=2, padding=2, dilation=2)",
                                      "        return torch.relu(self.conv(x))", (2, 20, 9, 8)),
    "conv2d_asymmetric_nobias": ("Conv2d(24, 32, (2, 3), padding=(0, 1), bias=False)",
                                 "        return self.conv(x) * 0.5", (1, 24, 5, 7)),
    "conv3d_grouped": ("Conv3d(32, 32, 3, padding=1, groups=2)", "        return torch.tanh(self.conv(x))",
                       (1, 32, 3, 4, 5)),
    "conv1d": ("Conv1d(16, 16, 5, padding=2)", "        return self.conv(x) + 1.0", (2, 16, 11)),
    "conv_transpose2d_stride1": ("ConvTranspose2d(16, 16, 3, padding=1)", "        return torch.sigmoid(self.conv(x))",
                                 (2, 16, 5, 6)),
    "conv_transpose2d_strided_dilated": ("ConvTranspose2d(32, 16, 3, stride=2, padding=1, dilation=2, groups=2)",
                                         "        return self.conv(x) - 0.25", (1, 32, 4, 5)),
    # sub-pixel: each phase steps through its own taps; a stride above the kernel leaves phases with none
    "conv_transpose2d_subpixel": ("ConvTranspose2d(16, 16, 3, stride=2, padding=1, output_padding=1)",
                                  "        return torch.clamp(self.conv(x), -0.3, 0.3)", (2, 16, 4, 3)),
    "conv_transpose1d_stride_over_kernel": ("ConvTranspose1d(16, 16, 2, stride=3, output_padding=2)",
                                            "        return self.conv(x) * 2.0", (2, 16, 5)),
    "conv_transpose3d_subpixel_grouped": ("ConvTranspose3d(32, 32, 3, stride=2, padding=1, groups=2)",
                                          "        return torch.relu(self.conv(x))", (1, 32, 2, 3, 3)),
}


def _tap_major_launches(mod, gid: str, strides: list | None = None) -> list:
    """The TAP_MAJOR of each launch of the conv group ``gid``'s kernel in the candidate module ``mod``, from now on (the
    launcher looks its kernel up in the module at call time); ``strides``: gets the input's and the weight's strides."""
    kernel, launched = getattr(mod, f"{gid}_kernel"), []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                launched.append(kw["TAP_MAJOR"])
                if strides is not None:
                    strides.append((args[0].stride(), args[1].stride()))
                return kernel[grid](*args, **kw)
            return launch

    setattr(mod, f"{gid}_kernel", Spy())
    return launched


@pytest.mark.parametrize("tap_major,nhwc", [(1, 0), (1, 1), (0, 0)])
@pytest.mark.parametrize("case", sorted(TAP_CASES))
def test_tap_major_and_flat_k_orders_match_torch(load, close, case, tap_major, nhwc):
    """Both K orders of the own conv against PyTorch, the launch's ``TAP_MAJOR`` as the config asks (1, the
    default, where a group has 16 or more input channels; 0 through a SetConfig, the flat order of before), and
    tap-major on channels-innermost copies of the input and the weight (``NHWC``)."""
    layer, forward, shape = TAP_CASES[case]
    p = _conv_problem(layer, forward, shape)
    b, grp = _conv_group(p)
    code = build(p, [SetConfig(grp.id, (("TAP_MAJOR", tap_major), ("NHWC", nhwc)), "K order")])
    mod = load(code.source)
    strides: list = []
    launched = _tap_major_launches(mod, grp.id, strides)
    ref, new, x = _seeded_pair(mod, shape)
    with torch.no_grad():
        close(new(x), ref(x), torch.float32)
    assert launched == [bool(tap_major)]
    (xs, ws), = strides
    assert (xs[1] == 1 and ws[1] == 1) == bool(nhwc), (xs, ws)  # the channels (the weight's dim 1) innermost


def test_few_input_channels_keep_the_flat_k_order(load):
    """Fewer than 16 input channels fill a K block with taps: the flat order is launched whatever the config says,
    and such a conv's space has no TAP_MAJOR to tune (nor has a conv that runs cuDNN's conv where it is tuned)."""
    from kernellab.agents.builtin import Precision

    for layer, shape, tunes in (("Conv2d(8, 16, 3)", (1, 8, 5, 5), False), ("Conv2d(16, 16, 3)", (1, 16, 5, 5), True),
                                ("ConvTranspose2d(8, 16, 3, stride=2)", (1, 8, 3, 3), False)):
        p = _conv_problem(layer, "        return self.conv(x)", shape)
        b, grp = _conv_group(p)
        mod = load(build(p, [SetConfig(grp.id, (("TAP_MAJOR", 1),), "tap-major")]).source)
        launched = _tap_major_launches(mod, grp.id)
        with torch.no_grad():
            mod.ModelNew()(torch.randn(*shape))
        assert launched == [tunes], layer
        assert "TAP_MAJOR" not in mod.SPACE[grp.id], layer  # the seed follows cuDNN where it is tuned
        child = load(build(p, [Precision(grp.id, "tf32rn")]).source)
        assert ("TAP_MAJOR" in child.SPACE[grp.id]) == ("NHWC" in child.SPACE[grp.id]) == tunes, layer


def test_residual_dag_epilogue_is_one_kernel(load, close):
    """``x * clamp(x + 3)`` reads the activation twice, a residual input and a per-channel scale come
    from outside: all in the conv kernel's epilogue (a chain-only rule would stop at the relu)."""
    extra = "        self.scale = torch.nn.Parameter(torch.rand(16, 1, 1) + 0.5)\n"
    fwd = """        y = torch.relu(self.conv(x))
        y = y * torch.clamp((y + 3) / 6, 0, 1)
        return y * self.scale + x.sum(1, keepdim=True)[:, :, 1:-1, 1:-1]"""
    p = _conv_problem("Conv2d(3, 16, 3)", fwd, (2, 3, 8, 7), extra=extra)
    b, grp = _conv_group(p)
    ops = [b.graph.node(n).op for n in grp.epilogue]
    assert ops.count("mul") >= 2 and "relu" in ops and "clamp" in ops, ops
    run(load, close, p, _inputs((2, 3, 8, 7), (1, 3, 5, 9)), torch.float32)


def test_conv_output_read_elsewhere_ends_the_epilogue(load, close):
    """A value of the epilogue that something outside reads (here the relu, also summed) must be
    the group's one output: the group ends there and the rest runs in kernels of its own."""
    fwd = """        y = torch.relu(self.conv(x))
        return torch.tanh(y) + y.mean()"""
    p = _conv_problem("Conv2d(3, 16, 3)", fwd, (2, 3, 6, 6))
    b, grp = _conv_group(p)
    assert b.graph.node(grp.tail).op == "relu" and grp.outputs == [grp.tail]
    run(load, close, p, _inputs((2, 3, 6, 6)), torch.float32)


# global pooling after the epilogue: the conv kernel reduces its tiles, nothing full-size is stored
POOLS = {
    "mean_keepdim": ("x.mean((2, 3), keepdim=True)", "mean"),
    "adaptive_avg_pool": ("torch.nn.functional.adaptive_avg_pool2d(x, 1)", "mean"),
    "sum": ("x.sum((2, 3))", "sum"),
    "amax": ("torch.amax(x, (2, 3))", "amax"),
    "amin": ("torch.amin(x, (-1, -2), keepdim=True)", "amin"),
    # over the channels: the whole channel row is in one tile, reduced in registers
    "channel_min": ("torch.min(x, dim=1, keepdim=True)[0]", "amin"),
    "channel_mean": ("x.mean(1)", "mean"),
    "channel_amax": ("torch.amax(x, 1)", "amax"),
}


@pytest.mark.parametrize("pool", sorted(POOLS))
@pytest.mark.parametrize("block_m", [None, 16])
def test_conv_with_global_pooling_is_one_conv_group(load, close, pool, block_m):
    expr, op = POOLS[pool]
    fwd = f"""        x = torch.nn.functional.gelu(self.conv(x)) * 0.5
        return {expr}"""
    p = _conv_problem("Conv2d(3, 16, 3, padding=1)", fwd, (2, 3, 6, 5))
    b, grp = _conv_group(p)
    # a keepdim channel reduction runs inside the epilogue (its per-pixel tail stores one column); the
    # others end the group as its reduction
    assert [b.graph.node(n).op for n in grp.nodes if b.graph.node(n).kind == "reduce"] == [op], grp.describe(b.graph)
    assert grp.row_reduction in (op, None) and (grp.row_reduction is None) == (pool == "channel_min")
    # BLOCK_M=16: several pixel blocks per sample (and a ragged last one) go through the finishing kernel
    acts = [SetConfig(grp.id, (("BLOCK_M", block_m),))] if block_m else []
    code = build(p, acts)
    assert "out_ptr + out_off" not in code.source  # the full-size output is never stored
    run(load, close, p, _inputs((2, 3, 6, 5), (3, 3, 9, 7)), torch.float32, actions=acts)


# reductions over the channels inside the epilogue (all channels in one tile, results broadcast back)
CHANNEL_BLOCKS = {
    "softmax": ("torch.sigmoid(torch.softmax(x, dim=1)) * 2.0", 16),
    "log_softmax": ("torch.log_softmax(x, 1) + x.mean(1, keepdim=True)", 16),
    # a per-pixel tail (one value per pixel): the store keeps one column
    "logsumexp": ("torch.relu(torch.logsumexp(x, dim=1, keepdim=True)) - 0.5", 16),
    "softmax_fma_path": ("torch.softmax(x, dim=1)", 6),
}


@pytest.mark.parametrize("block", sorted(CHANNEL_BLOCKS))
def test_channel_reductions_inside_the_epilogue(load, close, block):
    expr, cout = CHANNEL_BLOCKS[block]
    fwd = f"""        x = self.conv(x)
        return {expr}"""
    p = _conv_problem(f"Conv2d(3, {cout}, 3)", fwd, (2, 3, 6, 5))
    b, grp = _conv_group(p)
    assert any(b.graph.node(n).kind == "reduce" for n in grp.epilogue), grp.describe(b.graph)
    run(load, close, p, _inputs((2, 3, 6, 5), (1, 3, 9, 4)), torch.float32, kernels=1)


def test_subpixel_phases_with_a_per_pixel_tail(load, close):
    """Phases differ in size; the grid covers the largest, and a program past its own phase's tiles
    aliases a real tile (GROUP_M ordering): it must not store its all-masked channel reduction there."""
    fwd = """        x = self.conv(x)
        return torch.logsumexp(x, dim=1, keepdim=True) * 0.5"""
    p = _conv_problem("ConvTranspose2d(3, 16, 3, stride=2)", fwd, (2, 3, 5, 4))
    b, grp = _conv_group(p)
    acts = [SetConfig(grp.id, (("BLOCK_M", 16), ("GROUP_M", 8)))]
    assert "SUBPIX=True" in build(p, acts).source
    run(load, close, p, _inputs((2, 3, 5, 4), (3, 3, 4, 6)), torch.float32, actions=acts)


def test_pooling_of_a_value_read_elsewhere_stays_out(load, close):
    fwd = """        x = torch.relu(self.conv(x))
        return x.mean((2, 3)), x"""
    p = _conv_problem("Conv2d(3, 16, 3)", fwd, (2, 3, 6, 5))
    b, grp = _conv_group(p)
    assert grp.row_reduction is None
    run(load, close, p, _inputs((2, 3, 6, 5)), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_conv_half_types(load, close, dtype):
    p = _conv_problem("Conv2d(3, 16, 3, padding=1)", "        return torch.relu(self.conv(x)) + 1.0", (2, 3, 6, 5),
                      dtype=dtype)
    run(load, close, p, _inputs((2, 3, 6, 5)), dtype, kernels=1)


def test_depthwise_groups_that_change_with_small_sizes():
    """``groups=channels`` is a size (a Sym after capture at two sizes): ordinary convs read it from the
    shapes at run time, so the depthwise conv is still ours at the SMALL size the sandbox runs."""
    src = """import torch

channels = 6
SMALL = {"channels": 3}


class Model(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.dw = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)

    def forward(self, x):
        return torch.relu(self.dw(x))


def get_inputs():
    return [torch.randn(2, channels, 7, 6)]


def get_init_inputs():
    return [channels]
"""
    p = Problem(name="dw", source=src)
    code = build(p)
    assert any(": conv" in g for g in code.meta["groups"]) and not code.meta["uncaptured"], code.meta
    result = sandbox.evaluate(p, code.source, small=True, device="cpu", trials=2, timing=False)
    assert result["status"] == "correct", f"{result['status']}: {result['error_text']}"


def test_library_variant_and_precision_rule():
    p = _conv_problem("Conv2d(3, 16, 3)", "        return torch.relu(self.conv(x))", (2, 3, 6, 6))
    code = build(p)
    # fp32 at 1e-4, the weight is a parameter: 3xTF32 (never plain TF32 at this tolerance; a TF32 dot only of
    # operands rounded as cuDNN rounds them, for a TF32 reference)
    assert 'tl.dot(a, b, acc, input_precision="tf32x3")' in code.source
    assert 'tl.dot(a, b, acc, input_precision="tf32")' not in code.source
    assert "convolution" not in " ".join(code.meta["uncaptured"])
    lib = build(p, [LibraryGemm("*")])
    assert "torch.nn.functional.conv2d(" in lib.source and "conv [" not in " ".join(lib.meta["groups"])


def test_spec_errors_are_one_line():
    with pytest.raises(ValueError, match="stride must be 2 ints"):
        conv_kernel(ConvSpec("c", dims=2, stride=(1,)))
    with pytest.raises(ValueError, match="groups must be"):
        conv_kernel(ConvSpec("c", groups=0, transposed=True))
    ks = conv_kernel(ConvSpec("c"))
    assert set(ks.config) <= set(ks.space) | {"num_stages"} and "BLOCK_M" in ks.space


def test_a_conv_that_follows_cudnn_tunes_only_its_epilogue_tiles():
    """Under the TF32 reference cuDNN runs the conv and the kernel has no K loop: BLOCK_K, num_stages, TAP_MAJOR
    and NHWC leave the SPACE (they stay in CONFIG, for the kernel's own conv elsewhere)."""
    k_loop = {"BLOCK_K", "num_stages", "TAP_MAJOR", "NHWC"}
    own = conv_kernel(ConvSpec("c"))
    follows = conv_kernel(ConvSpec("c", tf32_reference="cudnn"))
    half = conv_kernel(ConvSpec("c", dtype="float16", tf32_reference="cudnn"))
    assert k_loop <= set(own.space) and k_loop <= set(half.space)
    assert set(own.space) - set(follows.space) == k_loop
    assert k_loop <= set(follows.config)


def test_launcher_rejects_mismatched_weight(load):
    mod = load("import torch\nimport triton\nimport triton.language as tl\n\n"
               + conv_kernel(ConvSpec("c", groups=2)).source)
    with pytest.raises(ValueError, match="does not match 5 input channels"):
        mod.launch_c(torch.randn(1, 5, 4, 4), torch.randn(4, 2, 3, 3))


# -- fp32 convs on CUDA: the reference is cuDNN in TF32 ---------------------------------------------

def rna_tf32(x: np.ndarray) -> np.ndarray:
    """PTX ``cvt.rna.tf32.f32`` by arithmetic, not bits: the nearest value with 11 significant bits at
    the value's own binade (normals) or at the smallest normal's (subnormals), ties away from zero."""
    x = np.asarray(x, dtype=np.float32)
    out = x.astype(np.float64)
    fin = np.isfinite(out) & (out != 0)
    _, e = np.frexp(out[fin])
    q = np.ldexp(1.0, np.maximum(e, -125) - 11)  # the TF32 spacing there
    out[fin] = np.copysign(np.floor(np.abs(out[fin]) / q + 0.5) * q, out[fin])
    with np.errstate(over="ignore"):
        return out.astype(np.float32)  # past the largest TF32 value: inf, as the rounding carries into the exponent


@pytest.mark.parametrize("asm", [False, pytest.param(True, marks=pytest.mark.gpu)])  # the PTX instruction: on a GPU
def test_tf32_rounding_is_cvt_rna(load, asm):
    """The kernel's TF32 rounding (the interpreter's bit arithmetic; on a GPU the PTX instruction the kernel
    runs there) against the arithmetic definition, over random bit patterns, exact ties of both signs,
    subnormals, the largest floats, infinities and NaN."""
    src = ("import torch\nimport triton\nimport triton.language as tl\n\n" + conv_kernel(ConvSpec("c")).source
           + "\n\n@triton.jit\ndef rna_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr, ASM: tl.constexpr):\n"
             "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
             "    x = tl.load(x_ptr + offs, mask=offs < N)\n"
             "    tl.store(y_ptr + offs, _c_tf32_rna(x, ASM), mask=offs < N)\n")
    mod = load(src)
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2**19, 2000, dtype=np.uint64).astype(np.uint32) << 13) | 0x1000  # exactly half way
    special = np.array([0, 0x80000000, 1, 0x1000, 0x1FFF, 0x2FFF, 0x807FF000, 0x007FFFFF, 0x7F7FFFFF, 0xFF7FEFFF,
                        0x7F7FF000, 0x3F800FFF, 0x3F801000, 0x3F801001, 0xBF803000, 0x7F800000, 0xFF800000],
                       dtype=np.uint32)
    allbits = np.concatenate([bits, ties, ties | 0x80000000, special])
    x = allbits.view(np.float32)
    nan = np.isnan(x)
    xt = torch.from_numpy(x.copy()).to("cuda" if asm else "cpu")
    y = torch.empty_like(xt)
    mod.rna_kernel[(triton_cdiv(len(x), 1024),)](xt, y, len(x), BLOCK=1024, ASM=asm)
    got = y.cpu().numpy()
    assert np.isnan(got[nan]).all()
    want = rna_tf32(x[~nan])
    bad = got[~nan].view(np.uint32) != want.view(np.uint32)
    assert not bad.any(), [(hex(a), hex(b), hex(c)) for a, b, c in zip(
        allbits[~nan][bad][:5], got[~nan].view(np.uint32)[bad][:5], want.view(np.uint32)[bad][:5], strict=True)]
    # ties went away from zero: the magnitude grew (the finite ones: an exponent of all ones is inf/NaN)
    t = ties.view(np.float32)
    fin = np.isfinite(t)
    assert fin.sum() > 1900 and (np.abs(got[20000:22000][fin]) > np.abs(t[fin])).all()


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


TF32RN_CASES = {
    "conv2d": ("Conv2d(24, 16, 3, padding=1)", "        return torch.relu(self.conv(x)) * 2.0", (2, 24, 6, 5)),
    "conv_transpose2d_subpixel": ("ConvTranspose2d(24, 16, 3, stride=2, padding=1, output_padding=1)",
                                  "        return self.conv(x) - 0.5", (2, 24, 4, 3)),
}


@pytest.mark.parametrize("case", sorted(TF32RN_CASES))
def test_tf32rn_conv_is_the_exact_conv_of_tf32_rounded_operands(load, case):
    """Precision "tf32rn": every product is the product of the TF32-rounded operands, so the conv equals
    a float64 conv of the rounded input and weight up to fp32 accumulation error, and differs from
    the float64 conv of the unrounded ones by TF32's rounding error (the rounding did happen)."""
    from kernellab.agents.builtin import Precision

    layer, forward, shape = TF32RN_CASES[case]
    p = _conv_problem(layer, forward, shape)
    b, grp = _conv_group(p)
    code = build(p, [Precision(grp.id, "tf32rn")])
    assert 'input_precision="tf32"' in code.source and "_tf32_conv_reference" not in code.source
    mod = load(code.source)
    torch.manual_seed(0)
    new = mod.ModelNew()
    x = torch.randn(*shape)
    with torch.no_grad():
        out = new(x).double()
        conv = new.conv
        ref64 = copy.deepcopy(mod.Model()).double()
        ref64.load_state_dict(new.state_dict())
        rounded = copy.deepcopy(ref64)
        rounded.conv.weight.copy_(torch.from_numpy(rna_tf32(conv.weight.numpy())).double())
        want = rounded(torch.from_numpy(rna_tf32(x.numpy())).double())
        exact = ref64(x.double())
    scale = want.abs().max().item()
    err_rounded = (out - want).abs().max().item()
    err_exact = (out - exact).abs().max().item()
    assert err_rounded <= 2e-6 * scale, (err_rounded, scale)  # fp32 sums of ~200 exact products
    assert err_exact > 10 * err_rounded and err_exact > 1e-5 * scale, (err_exact, err_rounded)


FOLLOW_CASES = {
    # (layer, forward, input shape): an epilogue, a spatial pooling, a channel reduction, a sub-pixel
    # transposed conv, a depthwise conv (FMA path), and a bare conv (nothing to fuse: cuDNN's output itself)
    "epilogue": ("Conv2d(3, 16, 3, stride=2, padding=1)", "        return torch.nn.functional.gelu(self.conv(x)) + 1.0",
                 (2, 3, 9, 7), "conv2d"),
    "pooled": ("Conv2d(3, 16, 3)", "        return torch.relu(self.conv(x)).mean((2, 3))", (2, 3, 8, 8), "conv2d"),
    "channel_softmax": ("Conv2d(3, 8, 3)", "        return torch.softmax(self.conv(x), 1)", (2, 3, 6, 7), "conv2d"),
    "transposed_subpixel": ("ConvTranspose2d(4, 16, 3, stride=2, padding=1, output_padding=1)",
                            "        return torch.clamp(self.conv(x), -0.3, 0.3)", (2, 4, 5, 4), "conv_transpose2d"),
    "depthwise": ("Conv2d(5, 5, 3, padding=1, groups=5)", "        return torch.tanh(self.conv(x))", (2, 5, 6, 6),
                  "conv2d"),
    "conv3d_bare": ("Conv3d(2, 16, 3, bias=False)", "        return self.conv(x)", (1, 2, 4, 5, 5), "conv3d"),
}


@pytest.mark.parametrize("case", sorted(FOLLOW_CASES))
def test_seed_follows_a_tf32_reference_with_cudnns_conv_and_our_epilogue(load, close, monkeypatch, case):
    """The seed decides at call time. Where ``_tf32_conv_reference`` says the reference conv is cuDNN in
    TF32 (a CUDA fp32 tensor under the default flags; here forced, on the CPU), the launcher calls
    torch's conv exactly once, with the reference's arguments, and our kernel runs the epilogue on its
    output (LIBRARY); anywhere else no torch conv runs at all. Both match the reference."""
    from kernellab.compiler.codegen import CONV_ON_TF32_REFERENCE

    layer, forward, shape, fn = FOLLOW_CASES[case]
    p = _conv_problem(layer, forward, shape)
    code = build(p)
    assert "def _tf32_conv_reference(x):" in code.source
    mod = load(code.source)
    calls = []
    real = getattr(torch.nn.functional, fn)

    def counted(*a, **k):
        calls.append((a[2:], k))
        return real(*a, **k)

    monkeypatch.setattr(torch.nn.functional, fn, counted)
    ref, new, x = _seeded_pair(mod, shape)
    with torch.no_grad():
        want = ref(x)
        n_ref = len(calls)
        calls.clear()
        close(new(x), want, torch.float32)  # the CPU: our own conv
        assert calls == [] and n_ref == 1
        mod._tf32_conv_reference = lambda x: True
        # "tf32rn" is judged against the exact CPU reference here: TF32's error, not fp32's
        tol = {} if CONV_ON_TF32_REFERENCE == "cudnn" else {"atol": 1e-2, "rtol": 1e-2}
        close(new(x), want, torch.float32, **tol)
    assert len(calls) == (1 if CONV_ON_TF32_REFERENCE == "cudnn" else 0), calls
    if calls:
        assert calls[0][0][0] is None  # bias-free: the bias is the epilogue's, as cuDNN's own bias add is separate


def test_the_tf32_reference_is_read_from_the_flags_at_call_time(load, monkeypatch):
    """The generated predicate: a CPU tensor never; a CUDA fp32 tensor when cuDNN is on and its conv
    precision is TF32 (PyTorch's default), not after ``allow_tf32 = False`` or ``conv.fp32_precision =
    "ieee"``, nor with cuDNN off; a half tensor never. (cuDNN is made to look available: no GPU here.)"""
    import types

    p = _conv_problem("Conv2d(3, 16, 3)", "        return torch.relu(self.conv(x))", (2, 3, 6, 6))
    mod = load(build(p).source)
    ref = mod._tf32_conv_reference
    cuda32 = types.SimpleNamespace(is_cuda=True, dtype=torch.float32)
    assert ref(torch.randn(2)) is False
    cudnn = torch.backends.cudnn
    monkeypatch.setattr(cudnn, "is_available", lambda: True)
    old = cudnn.conv.fp32_precision
    assert old == "tf32"  # PyTorch's default, as on the H200
    try:
        assert ref(cuda32) is True
        assert ref(types.SimpleNamespace(is_cuda=True, dtype=torch.float16)) is False
        cudnn.conv.fp32_precision = "ieee"
        assert ref(cuda32) is False
        cudnn.conv.fp32_precision = "tf32"
        cudnn.allow_tf32 = False
        assert ref(cuda32) is False
        cudnn.allow_tf32 = True
        assert ref(cuda32) is True
        with cudnn.flags(enabled=False):
            assert ref(cuda32) is False
    finally:
        cudnn.allow_tf32 = True
        cudnn.conv.fp32_precision = old


def test_a_precision_action_or_a_half_type_pins_our_own_conv():
    """Only the seed's fp32 conv follows the reference: a Precision child runs our conv everywhere, a
    half-type conv has no TF32 question, and loose tolerances (plain TF32 admitted) keep our TF32 conv."""
    from kernellab.agents.builtin import Precision

    p = _conv_problem("Conv2d(3, 16, 3)", "        return torch.relu(self.conv(x))", (2, 3, 6, 6))
    _, grp = _conv_group(p)
    assert "_tf32_conv_reference(x)" in build(p).source
    for prec in ("tf32rn", "tf32x3", "ieee"):
        assert "_tf32_conv_reference" not in build(p, [Precision(grp.id, prec)]).source, prec
    half = _conv_problem("Conv2d(3, 16, 3)", "        return torch.relu(self.conv(x))", (2, 3, 6, 6), dtype=torch.float16)
    assert "_tf32_conv_reference" not in build(half).source
    loose = Problem(name="t", source=p.source.replace("DTYPE = 'float32'", "DTYPE = 'float32'\nATOL = RTOL = 1e-2"))
    assert "_tf32_conv_reference" not in build(loose).source and 'input_precision="tf32"' in build(loose).source
    with pytest.raises(ValueError, match="tf32rn is for conv groups"):
        lin = Problem(name="l", source="""import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
""")
        g = next(g for g in built(lin).groups if g.kind == "gemm")
        build(lin, [Precision(g.id, "tf32rn")])


# -- KernelBench problems through the sandbox (SMALL sizes on the CPU) -------------------------------

KB_SMALL = ["level2/57_Conv2d_ReLU_HardSwish.py", "level2/67_Conv2d_GELU_GlobalAvgPool.py",
            # ~17-28 s interpreted (a stride-2 transposed conv visits 4x the taps it uses)
            pytest.param("level2/2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide.py", marks=pytest.mark.slow)]


@pytest.mark.parametrize("rel", KB_SMALL)
def test_kernelbench_conv_seed_is_correct_with_own_kernels(rel):
    path = KB_DIR / rel
    if not path.exists():
        pytest.skip(f"KernelBench not found at {KB_DIR}")
    from kernellab.agents.builtin import seed

    problem = load_problem(path)
    code = seed(problem)[0]
    assert any(": conv" in g for g in code.meta["groups"]), code.meta["groups"]
    result = sandbox.evaluate(problem, code.source, small=True, device="cpu", trials=2, timing=False)
    assert result["status"] == "correct", f"{result['status']}: {result['error_text']}"
    assert result["library_only"] is False


# -- full KernelBench size on the GPU (the lead runs these on the H200) -------------------------------

# outputs of 2.1 GB (537M fp32 values) in 2, 67 and 86: the sandbox holds several, so they run alone, and with
# tests-slow (57 and 47 are the sweep's cases in every call): 15-28 s each alone, the bigmem group 161 s in session 10
_BIG = (pytest.mark.bigmem, pytest.mark.gpu_slow)
KB_GPU = ["level2/57_Conv2d_ReLU_HardSwish.py", "level2/47_Conv3d_Mish_Tanh.py",
          pytest.param("level2/2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide.py", marks=_BIG),
          pytest.param("level2/67_Conv2d_GELU_GlobalAvgPool.py", marks=_BIG),
          pytest.param("level1/86_conv_depthwise_separable_2D.py", marks=_BIG)]


# convs with nothing after them to fuse (86: depthwise then pointwise, bias-free): under a TF32 reference
# the "cudnn" seed returns cuDNN's outputs themselves, a library-only candidate
_NO_EPILOGUE = {"level1/86_conv_depthwise_separable_2D.py"}


@pytest.mark.gpu
@pytest.mark.parametrize("rel", KB_GPU)
def test_kernelbench_conv_on_gpu_full_size(rel):
    """The seed at full size, judged against the default (cuDNN TF32) reference. Correct first; then the
    share of our kernels that the chosen ``CONV_ON_TF32_REFERENCE`` gives: with "cudnn" the conv is
    cuDNN's and ours is the fused epilogue (> 0, or library-only where there is none); with "tf32rn" the
    conv is ours (> 0.5)."""
    from kernellab.compiler.codegen import CONV_ON_TF32_REFERENCE

    path = KB_DIR / rel
    if not path.exists():
        pytest.skip(f"KernelBench not found at {KB_DIR}")
    problem = load_problem(path)
    code = build(problem)
    result = sandbox.evaluate(problem, code.source, small=False, device="cuda", trials=3, timing=True)
    assert result["status"] == "correct", f"{result['status']}: {result['error_text']}"
    share = result.get("own_kernel_share")
    own = result["details"].get("own_kernels")
    if CONV_ON_TF32_REFERENCE == "tf32rn":
        assert share is not None and share > 0.5, (share, own)
    elif rel in _NO_EPILOGUE:
        assert result["library_only"] is True, (share, own)
    else:
        assert result["library_only"] is False and share is not None and share > 0, (share, own)
    print(f"{rel}: {result.get('median_ms')} ms, eager {result.get('eager_ms')} ms, compile {result.get('compile_ms')} ms, "
          f"own-kernel share {share}")


# not 86 (depthwise separable): there tf32rn is 1143 of 537M elements beyond 1e-4 of cuDNN (H200, 2026-12-01),
# which is why the seed calls cuDNN on a TF32 reference (codegen.CONV_ON_TF32_REFERENCE)
KB_TF32RN = ["level2/47_Conv3d_Mish_Tanh.py",
             pytest.param("level2/2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide.py", marks=_BIG)]


@pytest.mark.gpu
@pytest.mark.parametrize("rel", KB_TF32RN)
def test_tf32rn_own_conv_on_gpu_full_size(rel):
    """Our own conv with every conv group at "tf32rn", judged against the cuDNN TF32 reference at full
    size, where it matches (the probe experiments/probes/conv_tf32.py found where it does not)."""
    from kernellab.agents.builtin import Precision

    path = KB_DIR / rel
    if not path.exists():
        pytest.skip(f"KernelBench not found at {KB_DIR}")
    problem = load_problem(path)
    acts = [Precision(g.id, "tf32rn") for g in built(problem).groups if g.kind == "conv"]
    assert acts
    code = build(problem, acts)
    result = sandbox.evaluate(problem, code.source, small=False, device="cuda", trials=3, timing=True)
    assert result["status"] == "correct", f"{result['status']}: {result['error_text']}"
    share = result.get("own_kernel_share")
    assert share is not None and share > 0.5, (share, result["details"].get("own_kernels"))
    print(f"{rel} tf32rn: {result.get('median_ms')} ms, eager {result.get('eager_ms')} ms, own-kernel share {share:.2f}")


def test_strided_transposed_conv_takes_the_subpixel_path():
    """The phase split is what the transposed cases above exercise when strided and undilated. Its phases are the
    innermost part of the grid's first axis (the phases of a tile share input reads and output sectors in L2),
    not an axis of their own that runs phase after phase."""
    for case, want in (("conv_transpose2d_stride_over_kernel", True), ("conv_transpose2d_grouped_dilated", False)):
        layer, forward, shape, _ = CASES[case]
        source = build(_conv_problem(layer, forward, shape)).source
        assert ("SUBPIX=True" in source) is want, case
        assert "tl.program_id(2)" not in source
        if want:
            assert "cls = pid % (SD * SH * SW)" in source and "triton.cdiv(cout_g, bn) * 9, groups)" in source  # stride 3 x 3


def test_planner_and_debugger_know_conv_groups():
    """The plan offers cuDNN (and unfusing the pooling) for a conv group, and our own conv pinned at each
    admitted precision (tf32rn first: on the GPU the seed's conv follows cuDNN, these children do not).
    A mismatch judged on the CPU first gets IEEE dots in the conv, then cuDNN; one judged on the GPU,
    whose fp32 reference is cuDNN TF32, gets tf32rn dots, then cuDNN. All replay to candidates that
    differ as said."""
    from kernellab.agents.builtin import BuiltinAgents, KeepRowOut, Precision, candidate_actions

    fwd = "        return torch.relu(self.conv(x)).mean((2, 3))"
    p = _conv_problem("Conv2d(3, 16, 3)", fwd, (2, 3, 6, 6))
    b, grp = _conv_group(p)
    acts = [a for a, gid in candidate_actions(p, b) if gid == grp.id]
    assert LibraryGemm(grp.gemm) in acts and KeepRowOut(grp.id) in acts
    assert {Precision(grp.id, x) for x in ("tf32rn", "tf32x3", "ieee")} <= set(acts)
    assert Precision(grp.id, "tf32") not in acts  # fp32 at 1e-4
    pinned = built(p, [Precision(grp.id, "tf32rn")])
    assert Precision(grp.id, "tf32rn") not in [a for a, _ in candidate_actions(p, pinned)]
    assert built(p, [KeepRowOut(grp.id)]).groups[-1].kind == "rows"  # the mean in a kernel of its own
    code = build(p)
    for interpreted, first in ((True, "ieee"), (False, "tf32rn")):
        row = {"id": "c1", "parent_id": None, "source": code.source, "meta": code.meta, "selected": True,
               "best": {"status": "incorrect"}}
        seen = []
        for _ in range(2):
            fix = BuiltinAgents().debug(p, row, {"status": "incorrect", "error_text": "max abs err 0.3",
                                                 "interpreted": interpreted})
            seen.append(action_from_dict(fix.meta["actions"][-1]))
            row = {**row, "source": fix.source, "meta": fix.meta}
        assert seen == [Precision(grp.id, first), LibraryGemm(grp.gemm)], (interpreted, seen)
        want = 'acc = tl.dot(a, b, acc, input_precision="ieee")' if first == "ieee" else "    rn = True\n"
        assert want in build(p, [seen[0]]).source


def test_a_parent_judged_on_the_cpu_gets_no_tf32rn_child():
    """tf32rn reproduces cuDNN's TF32 reference on the GPU; against the CPU's exact fp32 conv it can only fail, so a
    parent judged in the interpreter is not offered it (a GPU-judged one is)."""
    from kernellab.agents.builtin import BuiltinAgents

    p = _conv_problem("Conv2d(3, 16, 3)", "        return torch.relu(self.conv(x))", (2, 3, 6, 6))
    code = build(p)

    def offered(interpreted: int) -> set:
        row = {"id": "c1", "parent_id": None, "source": code.source, "meta": code.meta, "selected": True,
               "best": {"status": "correct", "speedup_eager": 1.0, "interpreted": interpreted}}
        props = BuiltinAgents().plan(p, [row], 50, {})
        return {(q.action or {}).get("precision") for q in props if (q.action or {}).get("kind") == "precision"}

    assert "tf32rn" not in offered(1) and "ieee" in offered(1)
    assert "tf32rn" in offered(0)


# library conv kernels the seeds ran on the H200 (KernelBench levels 1-2, kb-public-level12-budget4.db.gz), with the
# child that matched the reference there (tf32rn for a TF32 kernel, tf32x3 for an fp32 one)
_H200_CONVS = [
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1", "tf32"),
    ("sm90_xmma_dgrad_implicit_gemm_indexed_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize256x64x32", "tf32"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4>", "tf32"),
    ("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize128x128x8_stage3", "fp32"),
    ("void implicit_convolveNd_sgemm<float, 3, 1024, 5, 5, 3, 3, 3, 1, false, false, true>(int, int)", "fp32"),
    ("void convolveNd_dgrad_float_engine<float, 3, 512, 6, 5, 3, 3, 3, false>(int, int, int)", "fp32"),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*)", "fp32"),
]


def test_the_library_conv_kernel_names_say_which_numerics_the_reference_has():
    from kernellab.agents.builtin.planner import library_conv_numerics

    for name, want in _H200_CONVS:
        # beside the layout transposes and our own epilogue, which are no conv
        assert library_conv_numerics([name, "void cudnn::engines_precompiled::nchwToNhwcKernel<float>", "g_relu"]) == want
    assert library_conv_numerics(["g_relu", "void at::native::vectorized_elementwise_kernel<4>"]) is None
    assert library_conv_numerics([_H200_CONVS[0][0], _H200_CONVS[3][0]]) is None  # two that disagree: unknown


def test_the_seeds_cudnn_kernel_decides_the_conv_precision_children():
    """On the GPU the eager reference runs the same cuDNN call as the seed, so the seed's conv kernel says what the
    reference computed in: after a TF32 kernel only tf32rn can match it, after an fp32 one only tf32x3 and ieee
    (on the H200 the other child was incorrect in 28 of 33 tries, correct only where the matching one was too). No
    such kernel seen, or two that disagree (the Inductor seed's layout may get another algorithm): all of them."""
    from kernellab.agents.builtin import BuiltinAgents

    p = _conv_problem("Conv2d(16, 32, 3)", "        return torch.relu(self.conv(x))", (2, 16, 6, 6))
    code = build(p)

    def offered(kernels: list[str]) -> set:
        row = {"id": "c1", "parent_id": None, "source": code.source, "meta": code.meta, "selected": True,
               "best": {"status": "correct", "speedup_eager": 1.0, "interpreted": 0,
                        "details": {"kernels": [{"name": n, "own": n.startswith("g_")} for n in kernels]}}}
        props = BuiltinAgents().plan(p, [row], 50, {})
        return {(q.action or {}).get("precision") for q in props if (q.action or {}).get("kind") == "precision"}

    assert offered([_H200_CONVS[0][0], "g_relu"]) == {"tf32rn"}
    assert offered([_H200_CONVS[3][0], "g_relu"]) == {"tf32x3", "ieee"}
    assert offered(["g_relu"]) == {"tf32rn", "tf32x3", "ieee"}


def test_a_mismatch_on_the_gpu_gets_the_precision_cudnns_kernel_had():
    """The debugger's first fix for a conv mismatch judged on the GPU is tf32rn (cuDNN's TF32 rounding), unless the
    plan saw cuDNN run an fp32 kernel for this conv: IEEE dots then."""
    from kernellab.agents.builtin import BuiltinAgents, Precision

    p = _conv_problem("Conv2d(16, 32, 3)", "        return torch.relu(self.conv(x))", (2, 16, 6, 6))
    b, grp = _conv_group(p)
    code = build(p)

    def first_fix(kernel: str) -> Precision:
        agents = BuiltinAgents()
        seed = {"id": "c1", "parent_id": None, "source": code.source, "meta": code.meta, "selected": True,
                "best": {"status": "correct", "speedup_eager": 1.0, "interpreted": 0,
                         "details": {"kernels": [{"name": kernel, "own": False}]}}}
        agents.plan(p, [seed], 4, {})
        fix = agents.debug(p, {**seed, "best": {"status": "incorrect"}},
                           {"status": "incorrect", "error_text": "max abs err 0.3", "interpreted": False})
        return action_from_dict(fix.meta["actions"][-1])

    assert first_fix(_H200_CONVS[3][0]) == Precision(grp.id, "ieee")
    assert first_fix(_H200_CONVS[0][0]) == Precision(grp.id, "tf32rn")


@pytest.mark.parametrize("layer, shape", [("Conv2d(8, 8, 3, groups=8)", (2, 8, 6, 6)),
                                          ("ConvTranspose2d(8, 8, 3, groups=8)", (2, 8, 5, 5))])
def test_a_depthwise_conv_gets_one_precision_child(layer, shape):
    """Narrower than DOT_MIN_N channels a group, the conv takes the FMA path, exact fp32 whatever the dot precision:
    tf32rn and tf32x3 children would be one conv twice (KernelBench's 83 and 85 spent half their budget so)."""
    from kernellab.agents.builtin import Precision, candidate_actions

    p = _conv_problem(layer, "        return self.conv(x)", shape)
    b, grp = _conv_group(p)
    precisions = [a for a, gid in candidate_actions(p, b) if gid == grp.id and isinstance(a, Precision)]
    assert precisions == [Precision(grp.id, "ieee")]
    assert "USE_DOT" in build(p, precisions).source and "use_dot = cout_g >= int(cfg.get(\"DOT_MIN_N\", 8))" in \
        build(p, precisions).source
    wide = _conv_problem("Conv2d(8, 16, 3)", "        return self.conv(x)", (2, 8, 6, 6))
    b, grp = _conv_group(wide)
    assert {a.precision for a, gid in candidate_actions(wide, b) if gid == grp.id and isinstance(a, Precision)} >= {
        "tf32rn", "ieee"}
