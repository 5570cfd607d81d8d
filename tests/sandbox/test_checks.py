"""Unit tests of the comparison, input distributions, environment scrubbing and ncu parsing
(no worker processes: fast)."""

from __future__ import annotations

import pytest
import torch

from kernellab.sandbox._check import (
    DISTRIBUTIONS,
    check_structure,
    compare,
    modified_inputs,
    overlaps,
    transform,
)
from kernellab.sandbox._env import is_secret, worker_env
from kernellab.sandbox._profile import METRICS, ProfileResult, parse_raw_csv, profile

SHAPES = [(1,), (127,), (3, 127), (33, 65), (2, 17, 31)]
DTYPES = [(torch.float32, 1e-4, 1e-4), (torch.float16, 1e-2, 1e-2), (torch.bfloat16, 1e-2, 1e-2)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
def test_compare_equal_passes_and_perturbed_fails(shape, dtype, atol, rtol):
    torch.manual_seed(0)
    ref = torch.randn(shape).to(dtype)
    assert compare(ref, ref.clone(), atol, rtol)["ok"]
    bad = ref.clone()
    idx = tuple(s - 1 for s in shape)  # the last element
    bad[idx] = bad[idx] + 1.0
    res = compare(ref, bad, atol, rtol)
    assert not res["ok"] and res["error_class"] == "mismatch"
    assert res["first_bad"] == [list(idx)]
    assert res["max_abs_err"] == pytest.approx(1.0, rel=1e-2)


@pytest.mark.parametrize("shape", SHAPES)
def test_compare_small_uniform_error_caught_by_relative_norm(shape):
    ref = torch.full(shape, 1e-5)
    out = torch.zeros(shape)  # passes allclose thanks to atol, but is 100% wrong
    res = compare(ref, out, 1e-4, 1e-4)
    n = ref.numel()
    # the norm check needs the error to exceed atol in norm: only large enough outputs are caught
    assert res["ok"] == (1e-5 * n ** 0.5 <= 1e-4)


def test_nan_inf_rules():
    ref = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert compare(ref, ref.clone(), 1e-4, 1e-4)["ok"]
    out = ref.clone()
    out[0] = float("nan")
    res = compare(ref, out, 1e-4, 1e-4)
    assert not res["ok"] and res["error_class"] == "nan" and res["first_bad"] == [[0]]
    out = ref.clone()
    out[2] = -float("inf")
    assert compare(ref, out, 1e-4, 1e-4)["error_class"] == "nan"


def test_structure_checks():
    ref = [torch.zeros(2, 3)]
    assert check_structure(ref, torch.zeros(2, 3)) is None
    assert check_structure(ref, torch.zeros(3, 2))[0] == "shape"
    assert check_structure(ref, torch.zeros(2, 3, dtype=torch.float64))[0] == "dtype"
    assert check_structure(ref, (torch.zeros(2, 3), torch.zeros(2, 3)))[0] == "count"
    assert check_structure(ref, {"y": 1})[0] == "type"


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_distributions_keep_shape_dtype_and_domain(dist):
    g = torch.Generator().manual_seed(0)
    pos = torch.rand(5, 7) + 0.5  # a problem whose inputs must stay positive (log, sqrt)
    ints = torch.arange(4)
    out = transform([pos, ints, 3], dist, g)
    assert out[0].shape == pos.shape and out[0].dtype == pos.dtype
    assert bool((out[0] >= 0).all())
    assert out[1] is ints and out[2] == 3
    if dist != "problem":
        assert not torch.equal(out[0], pos)


def test_aliasing_and_modification_helpers():
    x = torch.zeros(10)
    assert overlaps(x, x[3:5]) and not overlaps(x, torch.zeros(10))
    y = x.clone()
    assert modified_inputs([x], [y]) == []
    y[0] = float("nan")
    assert modified_inputs([x], [y]) == [0]


@pytest.mark.parametrize("name, secret", [
    ("OPENAI_API_KEY", True), ("ANTHROPIC_API_KEY", True), ("GITHUB_TOKEN", True), ("HF_TOKEN", True),
    ("AWS_ACCESS_KEY_ID", True), ("GOOGLE_APPLICATION_CREDENTIALS", True), ("AZURE_CLIENT_SECRET", True),
    ("MY_DB_PASSWORD", True), ("PATH", False), ("CUDA_VISIBLE_DEVICES", False), ("TRITON_CACHE_DIR", False),
])
def test_secret_names(name, secret):
    assert is_secret(name) is secret


def test_worker_env_is_an_allow_list(monkeypatch, tmp_path):
    monkeypatch.setenv("SOME_RANDOM_SETTING", "x")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-123")
    monkeypatch.setenv("TRITON_TOKEN", "t")  # allowed prefix, secret name: dropped
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")  # a knob of torch's CPU allocator: the user's value kept
    env = worker_env(str(tmp_path), {"KERNELLAB_SANDBOX_DEVICE": "cpu"})
    assert "SOME_RANDOM_SETTING" not in env and "OPENAI_API_KEY" not in env and "TRITON_TOKEN" not in env
    assert env["THP_MEM_ALLOC_ENABLE"] == "0"
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE")
    assert worker_env(str(tmp_path), {})["THP_MEM_ALLOC_ENABLE"] == "1"  # huge pages unless turned off
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)
    assert env["KERNELLAB_SANDBOX_DEVICE"] == "cpu" and "PATH" in env


RAW = '''==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum","smsp__sass_thread_inst_executed_op_ffma_pred_on.sum","launch__registers_per_thread","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
"","","","","","","","ns","byte","byte","inst","register/thread","",""
"0","123","python","h","gemm_bias_gelu_kernel","1","7","1000000","2110000000","2110000000","5000000000","128","3.5","0.5"
"1","123","python","h","gemm_bias_gelu_kernel","1","7","2000","1,000","0","0","40","1","2"
'''  # noqa: E501 - ncu's CSV lines as it writes them


def test_parse_ncu_raw_csv_and_derived_metrics():
    rows = parse_raw_csv(RAW, METRICS)
    d = {(k, m): v for k, m, v in rows}
    k = "gemm_bias_gelu_kernel"
    assert d[(k, "duration_ns")] == 1e6 and d[(k, "registers_per_thread")] == 128
    assert d[(k, "achieved_bandwidth_tbs")] == pytest.approx(4.22)
    assert d[(k, "bandwidth_pct_of_ceiling")] == pytest.approx(100.0)
    assert d[(k, "achieved_fp32_tflops")] == pytest.approx(10.0)
    assert d[(k, "top_stall_1_long_scoreboard")] == 3.5
    assert d[(k + "#1", "dram_bytes_read")] == 1000  # second launch of the same kernel
    assert (k + "#1", "top_stall_1_barrier") in d


def test_profile_without_ncu_says_why(tmp_path):
    from kernellab import Problem

    p = Problem(name="t", source="import torch\n")
    res = profile(p, "", ncu=str(tmp_path / "no-ncu"))
    assert isinstance(res, ProfileResult) and res == [] and "ncu" in res.reason


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_stale_memory_marks(dtype):
    from kernellab.sandbox._trials import POISON16, POISON32, _filled_empty, _has_poison

    ref = torch.randn(5, 7).to(dtype)
    with _filled_empty(True):
        never_written = torch.empty(5, 7, dtype=dtype)
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the call
    assert _has_poison(never_written, ref)
    assert not _has_poison(ref.clone(), ref)
    one_nan = ref.clone()
    one_nan[0, 0] = float("nan")  # the candidate's own NaN: incorrect, not stale memory
    assert not _has_poison(one_nan, ref)
    assert not _has_poison(never_written, torch.full_like(ref, float("nan")))  # the reference is all NaN too
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        word = ref.clone().contiguous()
        view = word.view(torch.int32 if word.element_size() == 4 else torch.int16)
        view[2, 3] = POISON32 if word.element_size() == 4 else POISON16  # the GPU poison: one word is enough
        assert _has_poison(word, ref)
    assert not _has_poison(torch.zeros(5, 7, dtype=torch.int32), ref)


def test_fp64_anchor_accepts_a_candidate_no_worse_than_the_fp32_reference():
    from kernellab.sandbox._check import anchored

    g = torch.Generator().manual_seed(0)
    exact = torch.randn(10_000, generator=g, dtype=torch.float64) * 10
    ref32 = (exact + 3e-4 * torch.randn(10_000, generator=g, dtype=torch.float64)).float()  # rounding of order atol
    other = (exact + 3e-4 * torch.randn(10_000, generator=g, dtype=torch.float64)).float()  # another summation order
    assert not torch.allclose(other, ref32, atol=1e-4, rtol=1e-4)  # the plain check rejects it
    a = anchored(exact, ref32, other, 1e-4, 1e-4)
    assert a["ok"] and a["ref_err_vs_fp64"] > 1e-4


def test_fp64_anchor_rejects_a_wrong_candidate_and_non_finite_output():
    from kernellab.sandbox._check import anchored

    g = torch.Generator().manual_seed(1)
    exact = torch.randn(10_000, generator=g, dtype=torch.float64)
    ref32 = (exact + 1e-5 * torch.randn(10_000, generator=g, dtype=torch.float64)).float()
    wrong = ref32.clone()
    wrong[123] += 0.01  # one element off by far more than the reference's own error
    assert not anchored(exact, ref32, wrong, 1e-4, 1e-4)["ok"]
    nan = ref32.clone()
    nan[7] = float("nan")
    assert not anchored(exact, ref32, nan, 1e-4, 1e-4)["ok"]


def test_fp64_anchor_does_not_vouch_when_the_fp64_reference_is_another_computation():
    # dropout drawn with other random numbers in float64: the fp32 reference sits O(1) from the fp64 one, and
    # "no worse than twice the reference's own error" would admit zeros
    from kernellab.sandbox._check import ANCHOR_TRUST, anchored

    g = torch.Generator().manual_seed(2)
    x = torch.randn(10_000, generator=g, dtype=torch.float64)
    mask64, mask32 = (torch.rand(10_000, generator=g) < 0.5), (torch.rand(10_000, generator=g) < 0.5)
    ref64, ref32 = x * mask64 * 2, (x * mask32 * 2).float()
    zeros = torch.zeros(10_000)
    a = anchored(ref64, ref32, zeros, 1e-4, 1e-4)
    assert not a["ok"] and not a["trusted"] and a["ref_rel_norm_vs_fp64"] > 10 * ANCHOR_TRUST
    assert a["cand_excess_vs_fp64"] <= 2.0 * a["ref_err_vs_fp64"]  # what the anchor alone would have passed
    # rounding-sized distances stay trusted, and so does rounding noise about exact zeros (GroupNorm of one channel)
    assert anchored(ref64, (ref64 * (1 + 1e-3)).float(), ref64.float(), 1e-4, 1e-4)["trusted"]
    noise = 1e-7 * torch.randn(10_000, generator=g)
    assert anchored(torch.zeros(10_000, dtype=torch.float64), noise, -noise, 1e-4, 1e-4)["ok"]
