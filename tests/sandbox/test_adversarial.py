"""The adversarial suite: one candidate per hack or failure, each must get its expected status.

Each file in ``adversarial/`` starts with header comments:
``# expect: STATUS [ERROR_CLASS]`` (required), ``# gpu`` (needs CUDA), ``# device: cpu``,
``# timing: on`` (timing runs, needed by checks made around it), ``# limits: phase=seconds,...``,
``# problem: NAME`` (a problem of ``problems/``; default ``tiny_relu``).
All jobs of the suite are submitted at once so that the pool's workers (and their replacements
after crashes) overlap; each test then checks one result.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from kernellab.sandbox import RESULT_KEYS, EvalJob, Limits

HERE = Path(__file__).resolve().parent
# one xdist worker runs the whole file: its module fixture submits every candidate at once, and on
# several workers each would submit (and wait for) the whole suite again
pytestmark = pytest.mark.xdist_group("adversarial")

CUDA = torch.cuda.is_available()
FILES = sorted((HERE / "adversarial").glob("*.py"))


def header(path: Path) -> dict:
    h = {"gpu": False, "timing": False, "limits": {}, "problem": "tiny_relu", "device": None}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        m = re.match(r"#\s*(\w+)\s*:?\s*(.*)$", line)
        if not m:
            continue
        key, val = m.group(1), m.group(2).strip()
        if key == "expect":
            parts = val.split()
            h["status"], h["error_class"] = parts[0], (parts[1] if len(parts) > 1 else None)
        elif key == "gpu":
            h["gpu"] = True
        elif key == "timing":
            h["timing"] = val == "on"
        elif key == "limits":
            h["limits"] = {k: float(v) for k, v in (kv.split("=") for kv in val.split(","))}
        elif key in ("problem", "device"):
            h[key] = val
    assert "status" in h, f"{path.name}: no '# expect:' header"
    return h


@pytest.fixture(scope="module")
def results(sandbox_executor, problem, tmp_path_factory):
    env_file = tmp_path_factory.mktemp("env") / "env.json"
    futures = {}
    for f in FILES:
        h = header(f)
        if h["gpu"] and not CUDA:
            continue
        config = {"OUT": str(env_file)} if f.stem == "writes_env" else None
        limits = Limits(**h["limits"]) if h["limits"] else None
        job = EvalJob(problem(h["problem"]), f.read_text(), config=config, device=h["device"],
                      trials=3, timing=h["timing"], limits=limits)
        futures[f.stem] = sandbox_executor.submit(job)
    return {"futures": futures, "env_file": env_file}


@pytest.mark.parametrize("path", [pytest.param(f, id=f.stem, marks=[pytest.mark.gpu] if header(f)["gpu"] else [])
                                  for f in FILES])
def test_adversarial_candidate_gets_its_status(path, results):
    h = header(path)
    r = results["futures"][path.stem].result(timeout=600)
    assert set(r) == set(RESULT_KEYS)
    got = (r["status"], r["error_class"])
    assert r["status"] == h["status"], f"{path.name}: got {got}, expected {h['status']}\n{r['error_text']}"
    if h["error_class"]:
        assert r["error_class"] == h["error_class"], f"{path.name}: got {got}\n{r['error_text']}"
    if r["status"] == "rejected":
        assert r["details"]["integrity"][0]["reason"] == h["error_class"].split(":", 1)[1]
    if r["status"] in ("compile_error", "runtime_error", "crash", "timeout", "incorrect", "rejected"):
        assert r["error_text"], "a failure always carries its error text"
    gpu_s = r["details"]["gpu_s"]  # every result says what it cost the device, failures included
    assert isinstance(gpu_s, float) and gpu_s >= 0.0


def test_gpu_s_charges_a_hang_its_limit_and_a_load_failure_nothing(results):
    hang = results["futures"]["hangs"].result(timeout=600)
    limit = header(HERE / "adversarial" / "hangs.py")["limits"]["compile"]
    assert hang["status"] == "timeout"
    assert limit <= hang["details"]["gpu_s"] < limit + 30  # killed at its compile limit, counted to the kill
    syntax = results["futures"]["syntax_error"].result(timeout=600)
    assert syntax["status"] == "compile_error" and syntax["details"]["gpu_s"] == 0.0


def test_writes_env_finds_no_credentials(results, fake_secrets):
    r = results["futures"]["writes_env"].result(timeout=600)
    assert r["status"] == "correct", r["error_text"]
    seen = json.loads(results["env_file"].read_text())
    text = json.dumps(seen)
    for name, value in fake_secrets.items():
        assert value not in text, f"{name} leaked into the worker"
        assert name not in seen["environ"]
    assert "sk-" not in seen["proc"]
    # a private working directory, which is also HOME
    assert "kernellab-worker-" in seen["cwd"] and seen["environ"]["HOME"] in seen["cwd"]


def test_library_only_and_own_kernel_share(results):
    triton_r = results["futures"]["correct_triton"].result(timeout=600)
    torch_r = results["futures"]["correct_torch"].result(timeout=600)
    assert triton_r["status"] == torch_r["status"] == "correct"
    assert triton_r["library_only"] is False and triton_r["own_kernel_share"] > 0
    assert torch_r["library_only"] is True and torch_r["own_kernel_share"] == 0
    if not CUDA:
        assert triton_r["details"]["own_kernel_launches"] == 3  # one launch per trial
        assert triton_r["details"]["own_kernels"] == ["relu_kernel"]


def test_a_value_keyed_cache_is_timed_at_its_real_cost(results):
    """Fresh values before every timed repetition: a cache keyed on the inputs never hits there."""
    r = results["futures"]["caches_by_values_slowly"].result(timeout=600)
    assert r["status"] == "correct", r["error_text"]
    assert r["median_ms"] >= 20.0 and r["p20_ms"] >= 20.0, r["details"]["timing"]
    assert r["details"]["last_timed_output"] == "checked"


def test_own_kernels_come_from_launches_not_from_comments(results):
    """Comments that declare kernels named like PyTorch's own make none of them the candidate's."""
    r = results["futures"]["comment_names_torch_kernel"].result(timeout=600)
    assert r["status"] == "correct", r["error_text"]
    assert r["library_only"] is True and r["own_kernel_share"] == 0
    assert r["details"]["own_kernels"] == []
    assert r["details"]["kernel_win_eligible"] is False


@pytest.mark.gpu
def test_comment_hack_leaves_cublas_and_elementwise_kernels_library(results):
    r = results["futures"]["gpu_comment_names_library_kernels"].result(timeout=600)
    assert r["status"] == "correct", r["error_text"]
    assert r["library_only"] is True and r["own_kernel_share"] < 0.5, r["details"].get("kernels")
    assert not any(k["own"] for k in r["details"]["kernels"]), r["details"]["kernels"]
    assert r["details"]["own_kernels"] == [] and r["details"]["kernel_win_eligible"] is False


@pytest.mark.gpu
def test_a_launched_cupy_kernel_is_own(results):
    r = results["futures"]["gpu_cupy_correct"].result(timeout=600)
    assert r["status"] == "correct", r["error_text"]
    assert r["details"]["own_kernels"] == ["relu2_cupy"], r["details"]["own_kernels"]
    assert r["library_only"] is False and r["own_kernel_share"] > 0.5, r["details"]["kernels"]
    assert r["details"]["kernel_win_eligible"] is True


def test_mismatch_reports_first_bad_indices(results):
    r = results["futures"]["first_row_only"].result(timeout=600)
    assert r["details"]["first_bad"][0][0] == 1  # row 0 is right, row 1 is the first wrong one
    assert r["details"]["failed_trial"] == 0
    assert r["max_abs_err"] > 0


def test_pool_survives_crashes(sandbox_executor, problem, results):
    """After the segfault, the exit and the timeout, the pool still evaluates the next candidate."""
    for name in ("segfaults", "exits", "hangs"):
        results["futures"][name].result(timeout=600)
    src = (HERE / "adversarial" / "correct_torch.py").read_text()
    r = sandbox_executor.submit(EvalJob(problem("tiny_relu"), src, trials=2, timing=False)).result(timeout=600)
    assert r["status"] == "correct"
