"""`kernellab export` / `kernellab.load_best`: the best candidate as one standalone file with its
tuned CONFIG, which a fresh process imports and loads the reference model's state_dict into."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from kernellab import load_best, load_problem
from kernellab.cli import main
from kernellab.export import ExportError, NoCorrectCandidate, export_source
from kernellab.store import Store

HERE = Path(__file__).resolve().parent
PROBLEM = HERE / "linear_relu.py"
CANDIDATES = {"self_contained": HERE / "candidate_self_contained.py",
              "uses_problem_model": HERE / "candidate_uses_problem_model.py"}
TUNED = {"BLOCK": 64}  # differs from the candidates' default 1024, so baking it in is observable


def _timed(ms: float, **kw) -> dict:
    return {"status": "correct", "median_ms": ms, "p20_ms": ms * 0.95, "p80_ms": ms * 1.05, "eager_ms": 3.0,
            "interpreted": True, "device": "cpu (Triton interpreter)", **kw}


def _campaign(db: Path, variant: str) -> tuple[str, str]:
    """A campaign on the Linear+ReLU problem whose best evaluation is a retime of the tuned config."""
    store = Store(db)
    cid = store.create_campaign("export-test", {"budget": 4}, "cpu", {"torch": torch.__version__})
    pid = store.add_problem(load_problem(PROBLEM))
    src = CANDIDATES[variant].read_text()
    seed = store.add_candidate(cid, pid, src, origin="seed", action="Triton ReLU after F.linear")
    store.add_evaluation(seed, _timed(2.0, config={}))
    store.add_evaluation(seed, _timed(1.5, config=TUNED), kind="retime")
    store.add_evaluation(seed, _timed(1.9, config={"BLOCK": 128}), kind="trial")
    # faster but wrong, and faster but only a trial: neither may be exported
    bad = store.add_candidate(cid, pid, src + "\n# broken variant\n", parent_id=seed, action="skip the mask")
    store.add_evaluation(bad, {"status": "incorrect", "median_ms": 0.1, "interpreted": True, "device": "cpu"})
    store.add_evaluation(seed, _timed(0.2, config={"BLOCK": 256}), kind="trial")
    store.close()
    return cid, pid


_CHECK = r"""
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("exported_best", sys.argv[1])
best = importlib.util.module_from_spec(spec); spec.loader.exec_module(best)
spec = importlib.util.spec_from_file_location("reference_problem", sys.argv[2])
prob = importlib.util.module_from_spec(spec); spec.loader.exec_module(prob)
out = {"config": best.CONFIG, "kernellab_imported": "kernellab" in sys.modules, "cases": []}
for batch, fin, fout in [(1, 32, 65), (127, 16, 33), (33, 64, 127), (8, 1, 1)]:
    torch.manual_seed(0)
    ref = prob.Model(fin, fout).eval()
    new = best.ModelNew(fin, fout).eval()  # other random weights until the state_dict is loaded
    x = torch.randn(batch, fin)
    with torch.no_grad():
        differs_before = not torch.allclose(new(x), ref(x))
        missing = new.load_state_dict(ref.state_dict(), strict=True)
        y_new, y_ref = new(x), ref(x)
    out["cases"].append({"shape": [batch, fin, fout], "differs_before": differs_before,
                         "max_abs_err": float((y_new - y_ref).abs().max()),
                         "close": bool(torch.allclose(y_new, y_ref, atol=1e-5, rtol=1e-5))})
print(json.dumps(out))
"""


@pytest.mark.parametrize("variant", sorted(CANDIDATES))
def test_exported_file_matches_reference_in_a_fresh_process(tmp_path: Path, variant: str) -> None:
    db = tmp_path / "k.db"
    cid, _ = _campaign(db, variant)
    out_file = tmp_path / "best.py"
    res = CliRunner().invoke(main, ["export", "export-test", "--db", str(db), "-o", str(out_file), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["path"] == str(out_file) and info["config"] == TUNED and info["campaign"] == cid
    assert info["interpreted"] and info["speedup_eager"] is None
    text = out_file.read_text()
    assert "CONFIG.update({'BLOCK': 64})" in text and "no speedup is claimed" in text
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, "-c", _CHECK, str(out_file), str(PROBLEM)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["config"] == TUNED  # the tuned value, not the default 1024
    assert not got["kernellab_imported"], "the exported file must not need kernellab"
    for case in got["cases"]:
        assert case["close"], case
    assert any(c["differs_before"] for c in got["cases"]), "state_dict loading was not exercised"


def test_load_best_returns_the_model_class(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    _campaign(db, "uses_problem_model")
    cls = load_best(str(db), "export-test", "linear_relu")
    assert cls.__name__ == "ModelNew"
    assert sys.modules[cls.__module__].CONFIG == TUNED
    ref_mod = load_problem(PROBLEM).module(small=True)
    torch.manual_seed(1)
    ref = ref_mod.Model(16, 127)
    new = cls(16, 127)
    new.load_state_dict(ref.state_dict())
    x = torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x), atol=1e-5, rtol=1e-5)
    assert load_best(str(db), "export-test") is cls  # same text, same module


def test_export_source_hoists_future_imports_and_keeps_one_model(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    _campaign(db, "uses_problem_model")
    with Store(db) as store:
        text = export_source(store, "export-test")
    compile(text, "best.py", "exec")  # `from __future__` after other code would be a SyntaxError
    first, second = ast.parse(text).body[:2]
    assert isinstance(first, ast.Expr) and "kernellab export" in first.value.value  # our header
    assert isinstance(second, ast.ImportFrom) and second.module == "__future__"
    assert text.count("from __future__ import annotations") == 1
    assert text.count("class Model(torch.nn.Module)") == 1  # the problem's, prepended once

    db2 = tmp_path / "k2.db"
    _campaign(db2, "self_contained")
    with Store(db2) as store:
        text2 = export_source(store, "export-test")
    assert text2.count("class Model(torch.nn.Module)") == 1  # its own; the problem's is not added
    assert "get_inputs" not in text2


def test_export_errors(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    _campaign(db, "self_contained")
    run = lambda *a: CliRunner().invoke(main, ["export", *a, "--db", str(db), "-o", str(tmp_path / "x.py")])
    assert run("no-such-campaign").exit_code == 2
    r = run("export-test", "--problem", "nope")
    assert r.exit_code == 2 and "no problem 'nope'" in r.output
    with Store(db) as store:
        cid = store.get_campaign("export-test")["id"]
        other = store.add_problem(load_problem(HERE.parent.parent / "experiments/problems/fusions/gemm_bias_gelu.py"))
        cand = store.add_candidate(cid, other, "class ModelNew: pass\n", origin="seed")
        store.add_evaluation(cand, {"status": "compile_error", "error_text": "SyntaxError", "device": "cpu"})
        with pytest.raises(ExportError, match="choose one with --problem"):
            export_source(store, "export-test")
        with pytest.raises(NoCorrectCandidate):
            export_source(store, "export-test", "gemm_bias_gelu")
    r = run("export-test", "--problem", "gemm_bias_gelu")
    assert r.exit_code == 1 and "no correct candidate" in r.output
    assert not (tmp_path / "x.py").exists()
    assert CliRunner().invoke(main, ["export", "export-test", "--db", str(tmp_path / "missing.db")]).exit_code == 2


def test_export_default_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "k.db"
    _campaign(db, "self_contained")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["export", "export-test", "--db", str(db)])
    assert res.exit_code == 0, res.output
    out = tmp_path / "exports" / "best_linear_relu.py"
    assert "exports/best_linear_relu.py" in res.output and "CONFIG.update({'BLOCK': 64})" in out.read_text()


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [pytest.param(1, marks=pytest.mark.gpu_slow), 127, pytest.param(1025, marks=pytest.mark.gpu_slow)])
def test_exported_kernel_on_the_gpu(tmp_path: Path, batch: int) -> None:
    """The exported Triton kernel compiled for a real GPU matches the reference there too."""
    db = tmp_path / "k.db"
    _campaign(db, "self_contained")
    cls = load_best(str(db), "export-test", "linear_relu")
    ref_mod = load_problem(PROBLEM).module()
    torch.manual_seed(0)
    ref = ref_mod.Model(256, 511).cuda().eval()
    new = cls(256, 511).cuda().eval()
    new.load_state_dict(ref.state_dict())
    x = torch.randn(batch, 256, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
