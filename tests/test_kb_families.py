"""experiments/kb_families.py: the family rule on KernelBench's own file names, and the per-family table of a
bench database made by the project's code (a real CPU bench of two bundled problems, then campaigns of the same
configuration written through the store API for the GPU cases a CPU run cannot produce)."""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter
from pathlib import Path

import pytest

from kernellab import load_problem
from kernellab.bench import bench_config, bench_summary, config_hash, run_bench
from kernellab.store import Store

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "kb_families.py"
_spec = importlib.util.spec_from_file_location("kb_families", SCRIPT)
fam = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fam)

TINY_KW = {"budget": 1, "trials": 1, "width": 1, "debug_rounds": 0, "device": "cpu", "small": True}
P = "experiments/problems/"
RAN = [P + "ops/softmax.py", P + "fusions/pointwise_chain.py"]  # a real bench runs these
WRITTEN = [P + n for n in ("ops/gemm_square.py", "ops/gemm_large_k.py", "ops/gemm_skinny.py", "ops/bmm.py",
                           "ops/gemm_bf16.py", "ops/conv2d.py", "fusions/conv_bn_relu.py", "ops/transpose.py")]
NOT_RUN = [P + "ops/maxpool2d.py"]
TRACEBACK = ('Traceback (most recent call last):\n  File "cand.py", line 3, in forward\n'
             "AssertionError: output 0: max abs err 3.1 > atol 1e-05")


def _kb_dir() -> Path | None:
    for d in (os.environ.get("KERNELBENCH_DIR"), ROOT / ".kb", ROOT.parent / "shared" / "kernelbench"):
        if d and (Path(d) / "level1").is_dir() and (Path(d) / "level2").is_dir():
            return Path(d)
    return None


@pytest.mark.parametrize("name,expected", [
    ("1_Square_matrix_multiplication_", "gemm_epilogue"), ("4_Matrix_vector_multiplication_", "gemm_epilogue"),
    ("10_3D_tensor_matrix_multiplication", "gemm_epilogue"), ("76_Gemm_Add_ReLU", "gemm_epilogue"),
    ("28_BMM_InstanceNorm_Sum_ResidualAdd_Multiply", "gemm_epilogue"),
    ("5_Matrix_scalar_multiplication", "pointwise"), ("20_LeakyReLU", "pointwise"), ("32_HardTanh", "pointwise"),
    ("6_Conv3d_Softmax_MaxPool_MaxPool", "conv_epilogue"), ("87_conv_pointwise_2D", "conv_epilogue"),
    ("86_conv_depthwise_separable_2D", "conv_epilogue"),
    ("58_ConvTranspose3d_LogSumExp_HardSwish_Subtract_Clamp", "transposed_conv"),
    ("64_conv_transposed_1D", "transposed_conv"),
    ("41_Max_Pooling_1D", "pooling"), ("46_Average_Pooling_3D", "pooling"),
    ("49_Max_reduction_over_a_dimension", "reduction_norm"), ("51_Argmax_over_a_dimension", "reduction_norm"),
    ("24_LogSoftmax", "reduction_norm"), ("37_FrobeniusNorm_", "reduction_norm"), ("38_L1Norm_", "reduction_norm"),
    ("92_cumsum_exclusive", "reduction_norm"), ("100_HingeLoss", "reduction_norm"),
    ("98_KLDivLoss", "reduction_norm"), ("97_ScaledDotProductAttention", "attention"),
])
def test_family_of_kernelbench_names(name: str, expected: str) -> None:
    assert fam.family(name) == expected


def test_family_from_the_models_ops_where_the_name_says_nothing() -> None:
    src = (ROOT / P / "fusions" / "conv_bn_relu.py").read_text()
    assert fam.model_ops(src)[:3] == ["Conv2d", "BatchNorm2d", "ReLU"]
    assert fam.family("mystery_block", src) == "conv_epilogue" and fam.family("mystery_block") == "other"
    # the heaviest family of the ops, not the first op: a hand-written loss is a reduction
    loss = (_kb_dir() or ROOT) / "level1" / "100_HingeLoss.py"
    hinge = loss.read_text() if loss.is_file() else (
        "import torch\nclass Model(torch.nn.Module):\n    def forward(self, p, t):\n"
        "        return torch.mean(torch.clamp(1 - p * t, min=0))\n")
    assert fam.family("mystery", hinge) == "reduction_norm"
    assert fam.family("transpose", (ROOT / P / "ops" / "transpose.py").read_text()) == "other"


def test_every_public_level_1_and_2_file_has_a_family() -> None:
    kb = _kb_dir()
    if kb is None:
        pytest.skip("no KernelBench checkout (KERNELBENCH_DIR, .kb or ../shared/kernelbench)")
    files = sorted(kb.glob("level[12]/*.py"))
    got = Counter(fam.family(f.stem, f.read_text()) for f in files)
    assert len(files) == 170 and got == {"gemm_epilogue": 43, "conv_epilogue": 44, "transposed_conv": 42,
                                         "reduction_norm": 25, "pointwise": 11, "pooling": 4, "attention": 1}, got
    # a level-2 file goes by its first op: every one is a GEMM, a conv or a transposed conv
    assert {fam.family(f.stem) for f in files if f.parent.name == "level2"} == {
        "gemm_epilogue", "conv_epilogue", "transposed_conv"}


# -- a bench database -------------------------------------------------------------------------------------
def _campaign(store: Store, path: str, chash: str, status: str = "done") -> tuple[str, str, str]:
    """A bench campaign as `kernellab bench` marks it (config.bench.config_hash), through the store API."""
    pid = store.add_problem(load_problem(ROOT / path))
    cfg = {"problem_ids": [pid], "problems": [path], "objective": "speedup_eager",
           "bench": {"config_hash": chash, "suite": "families"}}
    cid = store.create_campaign(f"bench-families-{Path(path).stem}", cfg, "NVIDIA H200", {})
    store.update_campaign(cid, status=status)
    return cid, pid, path


def _eval(store: Store, cid: str, pid: str, tag: str, *, kind: str = "full", **result) -> str:
    cand = store.add_candidate(cid, pid, f"class ModelNew:  # {tag}\n    pass\n", origin="seed")
    base = {"status": "correct", "interpreted": False, "library_only": False, "own_kernel_share": 0.9,
            "median_ms": 1.0, "p20_ms": 0.9, "p80_ms": 1.1, "eager_ms": 1.0, "compile_ms": 1.0}
    if result.get("status", "correct") != "correct":
        base = {"interpreted": False}
    store.add_evaluation(cand, {**base, **result}, kind=kind)
    return cand


def _ok(se: float, sc: float, **kw) -> dict:
    return {"speedup_eager": se, "speedup_compile": sc, "median_ms": 1.0 / se, "eager_ms": 1.0,
            "compile_ms": sc / se, **kw}


@pytest.fixture(scope="module")
def bench_db(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("families")
    db = tmp / "bench.db"
    store = Store(db)
    ran = tmp / "ran.txt"
    ran.write_text("\n".join(RAN) + "\n")
    run_bench(str(ran), store, TINY_KW, out_dir=tmp / "out")  # the real thing: softmax and pointwise_chain
    chash = config_hash(bench_config(TINY_KW))
    c = {Path(p).stem: _campaign(store, p, chash, "stopped" if "conv_bn_relu" in p else "done") for p in WRITTEN}
    # GEMM+epilogue: two own-kernel wins (one slower than eager), a library-only winner, no correct candidate,
    # a winner whose fresh-job re-timing failed
    _eval(store, *c["gemm_square"][:2], "fast", **_ok(2.0, 1.2))
    _eval(store, *c["gemm_large_k"][:2], "slow", **_ok(0.8, 0.4))
    _eval(store, *c["gemm_skinny"][:2], "cublas", **_ok(1.0, 1.0, library_only=True, own_kernel_share=0.0))
    _eval(store, *c["gemm_skinny"][:2], "own", **_ok(0.7, 0.7, own_kernel_share=0.2))
    _eval(store, *c["bmm"][:2], "a", status="incorrect", error_class="mismatch", error_text="trial 0: max abs err 0.5")
    _eval(store, *c["bmm"][:2], "b", status="compile_error", error_text="SyntaxError: invalid syntax")
    _eval(store, *c["bmm"][:2], "c", status="incorrect", error_class="mismatch", error_text=TRACEBACK)
    cand = _eval(store, *c["gemm_bf16"][:2], "flaky", **_ok(1.5, 1.5))
    store.add_evaluation(cand, {"status": "crash", "error_class": "infra:oom", "error_text": "CUDA out of memory",
                                "details": {"winner_retime": {"band": {}}}}, kind="retime")
    # conv+epilogue: an own-kernel winner slower than eager behind a faster candidate below the kernel-win share
    # (it counts, and the library path is named); an interrupted campaign with its error
    _eval(store, *c["conv2d"][:2], "cudnn-ish", **_ok(1.1, 1.0, own_kernel_share=0.3))
    _eval(store, *c["conv2d"][:2], "all-ours", **_ok(0.6, 0.5, own_kernel_share=0.9))  # correct, slower
    _eval(store, *c["conv_bn_relu"][:2], "partial", **_ok(1.3, 1.1))
    store.add_event(c["conv_bn_relu"][0], "error", {"error": "RuntimeError: the sandbox went away\nmore"})
    # other: finished with nothing evaluated; pooling (maxpool2d): never run
    suite = tmp / "suite.txt"
    suite.write_text("\n".join(RAN + WRITTEN + NOT_RUN) + "\n")
    store.close()
    return {"db": db, "suite": str(suite), "chash": chash, "tmp": tmp}


def _table(result: dict) -> dict:
    return {r["family"]: r for r in result["table"]}


def test_family_rows_count_what_the_bench_counts(bench_db: dict) -> None:
    store = Store(bench_db["db"])
    result = fam.build(store, bench_db["suite"])
    t = _table(result)
    assert result["config_hash"] == bench_db["chash"] and result["objective"] == "speedup_eager"
    assert [r["family"] for r in result["table"]] == ["gemm_epilogue", "conv_epilogue", "reduction_norm", "pointwise",
                                                      "pooling", "other", "all"]
    counts = {k: (r["problems"], r["finished"], r["any_correct"], r["correct"], r["short_of_target"])
              for k, r in t.items()}
    assert counts == {"gemm_epilogue": (5, 5, 3, 2, 3), "conv_epilogue": (2, 1, 1, 1, 1), "reduction_norm": (1, 1, 1, 1, 0),
                      "pointwise": (1, 1, 1, 1, 0), "pooling": (1, 0, 0, 0, 1), "other": (1, 1, 0, 0, 1),
                      "all": (11, 9, 6, 5, 5)}, counts
    conv = t["conv_epilogue"]  # its winner is ours at 0.6x, not the 1.1x candidate that is mostly library time
    assert conv["geomean_eager_correct"] == pytest.approx(0.6) and conv["fast_1_eager"] == 0.0
    g = t["gemm_epilogue"]
    assert g["win_share"] == pytest.approx(0.4) and not g["interpreted"]
    assert g["fast_1_eager"] == pytest.approx(0.2) and g["fast_1_compile"] == pytest.approx(0.2)
    assert g["geomean_eager_correct"] == pytest.approx((2.0 * 0.8) ** 0.5)
    assert g["geomean_compile_correct"] == pytest.approx((1.2 * 0.4) ** 0.5)
    assert g["geomean_eager_all"] == pytest.approx((2.0 * 0.8) ** (1 / 5))  # the three misses as 1.0x
    assert g["failures"] == {"mismatch": 2, "compile_error": 1}
    assert g["misses"] == {"library_only": 1, "no_correct": 1, "retime_failed": 1}
    # the bundled problems ran on the CPU: correctness only, no speedup claimed
    assert t["reduction_norm"]["interpreted"] and t["reduction_norm"]["fast_1_eager"] is None
    # the "all" row is the bench's own page over the same suite and database
    bench = bench_summary(bench_db["suite"], [store], TINY_KW, out_dir=bench_db["tmp"] / "summary")[0]["summary"]
    assert {k: v for k, v in t["all"].items() if k in bench} == bench
    assert sum(r["problems"] for k, r in t.items() if k != "all") == 11


def test_each_miss_carries_its_reason(bench_db: dict) -> None:
    result = fam.build(Store(bench_db["db"]), bench_db["suite"])
    misses = {m["problem"]: m for m in result["misses"]}
    # family by family (the table's order), then by folder and name (KernelBench: level, number)
    assert list(misses) == ["bmm", "gemm_bf16", "gemm_skinny", "conv_bn_relu", "maxpool2d", "transpose"]
    kinds = {n: m["kind"] for n, m in misses.items()}
    assert kinds == {"gemm_skinny": "library_only", "bmm": "no_correct", "gemm_bf16": "retime_failed",
                     "conv_bn_relu": "not_finished", "maxpool2d": "not_finished", "transpose": "no_evaluation"}
    assert "library-only" in misses["gemm_skinny"]["reason"] and "0.20 < 0.5" in misses["gemm_skinny"]["reason"]
    bmm = misses["bmm"]
    assert bmm["error_class"] == "mismatch" and "mismatch in 2 of 3" in bmm["reason"]
    assert bmm["reason"].endswith("AssertionError: output 0: max abs err 3.1 > atol 1e-05")  # a traceback's last line
    assert "re-timing failed: infra:oom: CUDA out of memory" in misses["gemm_bf16"]["reason"]
    # conv2d counts with our slower kernel, and the faster library path beside it is named
    conv2d = next(p for p in result["problems"] if p["problem"] == "conv2d")
    assert conv2d["own_kernel_win"] and conv2d["speedup_eager"] == pytest.approx(0.6)
    assert conv2d["library_ahead"]["speedup_eager"] == pytest.approx(1.1)
    assert conv2d["library_ahead"]["own_kernel_share"] == pytest.approx(0.3)
    assert not any(p.get("library_ahead") for p in result["problems"] if p["problem"] != "conv2d")
    md = fam.to_markdown(result)
    assert "## Own-kernel winners behind a library candidate (1)" in md and "on 1 of them it beats eager" in md
    assert "- `conv2d` (conv+epilogue): ours 0.60x, share 0.90; the library path 1.10x, share 0.30 (seed)" in md
    assert misses["conv_bn_relu"]["reason"] == ("not finished (stopped); 1 evaluation(s) so far, 1 correct; "
                                                "RuntimeError: the sandbox went away")
    assert misses["maxpool2d"]["reason"] == "not finished (not run)"
    assert all(m["reason"] and "\n" not in m["reason"] for m in result["misses"])
    # an unfinished problem's partial winner is not put beside its verdict
    row = next(p for p in result["problems"] if p["problem"] == "conv_bn_relu")
    assert not row["own_kernel_win"] and "speedup_eager" not in row
    # --allow-library counts the library-only winner (and the low share), as bench --allow-library does
    lib = _table(fam.build(Store(bench_db["db"]), bench_db["suite"], allow_library=True))
    assert lib["gemm_epilogue"]["correct"] == 3 and lib["conv_epilogue"]["correct"] == 1
    assert lib["conv_epilogue"]["geomean_eager_correct"] == pytest.approx(1.1)  # then the faster one is the winner


def test_cli_writes_the_page_and_refuses_bad_input(bench_db: dict, capsys: pytest.CaptureFixture) -> None:
    out = bench_db["tmp"] / "pages"
    args = ["--db", str(bench_db["db"]), "--suite", bench_db["suite"], "--out-dir", str(out), "--name", "t"]
    assert fam.main(args) == 0
    (md,) = out.glob("*-t-families.md")
    page = md.read_text()
    assert "**9 of 11 problems finished.**" in page
    assert "| GEMM+epilogue | 5 | 5 | 3 | 2 | 40% | 3 | 1 (0.20) | 1 (0.20) | 1.26x | 0.69x |" in page, page
    assert "| **all** | 11 | 9 | 6 | 5 | 45% | 5 |" in page
    assert "- `bmm` (GEMM+epilogue): no correct candidate: mismatch in 2 of 3 evaluation(s)" in page
    assert "- **pooling** (1): `maxpool2d`" in page
    assert json.loads(md.with_suffix(".json").read_text())["table"][-1]["correct"] == 5
    assert "5 of 11 problems with a correct own-kernel winner" in capsys.readouterr().err
    # bad input: one line, exit 2, no page
    assert fam.main(args + ["--config-hash", "nope"]) == 2
    assert "no bench campaign under config hash nope" in capsys.readouterr().err
    assert fam.main(["--db", str(bench_db["tmp"] / "none.db"), "--out-dir", str(out)]) == 2
    assert "none.db: no such database" in capsys.readouterr().err
    # two configurations in one database: the hash must be named
    two = bench_db["tmp"] / "two.db"
    store = Store(two)
    _campaign(store, P + "ops/gelu.py", bench_db["chash"])
    _campaign(store, P + "ops/softmax.py", "0123456789abcdef")
    store.close()
    args2 = ["--db", str(two), "--suite", bench_db["suite"], "--out-dir", str(out), "--name", "two"]
    assert fam.main(args2) == 2
    err = capsys.readouterr().err
    assert "under 2 configurations" in err and "pass --config-hash" in err and err.strip().count("\n") == 0, err
    assert not list(out.glob("*-two-families.*"))
    assert fam.main(args2 + ["--config-hash", "0123456789abcdef"]) == 0
    (two_md,) = out.glob("*-two-families.md")
    assert "**1 of 11 problems finished.**" in two_md.read_text()


def test_shard_databases_are_scored_together(bench_db: dict) -> None:
    # maxpool2d ran in another shard's database: together they score as `bench --summary-only --db A --db B`
    shard = Store(bench_db["tmp"] / "shard1.db")
    _eval(shard, *_campaign(shard, NOT_RUN[0], bench_db["chash"])[:2], "pool", **_ok(1.5, 1.1))
    stores = [Store(bench_db["db"]), shard]
    t = _table(fam.build(stores, bench_db["suite"]))
    assert (t["pooling"]["finished"], t["pooling"]["correct"], t["pooling"]["fast_1_compile"]) == (1, 1, 1.0)
    assert (t["all"]["finished"], t["all"]["correct"]) == (10, 6)
    bench = bench_summary(bench_db["suite"], stores, TINY_KW, out_dir=bench_db["tmp"] / "summary2")[0]["summary"]
    assert {k: v for k, v in t["all"].items() if k in bench} == bench
    assert "maxpool2d" not in {m["problem"] for m in fam.build(stores, bench_db["suite"])["misses"]}


def test_a_library_only_miss_says_what_became_of_our_own_candidates(tmp_path: Path) -> None:
    store = Store(tmp_path / "b.db")
    cid, pid, _ = _campaign(store, WRITTEN[0], "h")
    _eval(store, cid, pid, "cudnn", **_ok(1.0, 1.0, library_only=True, own_kernel_share=0.0))
    assert fam._own_failures(store.evaluations(campaign_id=cid, kind="full")) == "none was evaluated"
    _eval(store, cid, pid, "tf32rn", status="incorrect", error_class="mismatch", error_text="trial 3")
    _eval(store, cid, pid, "tf32x3", status="incorrect", error_class="mismatch", error_text="trial 0")
    _eval(store, cid, pid, "broken", status="compile_error", error_text="SyntaxError")
    assert fam._own_failures(store.evaluations(campaign_id=cid, kind="full")) == "ours: mismatch 2, compile_error 1"
