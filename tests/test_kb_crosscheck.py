"""experiments/kb_crosscheck.py: the pure parts on the CPU (reading a bench database, the side-by-side
table and agreement counts, the one-line refusal without CUDA); the KernelBench run itself on a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kb_reference_problems import DROPOUT, TARGETS

from kernellab import load_problem
from kernellab.store import Store

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "kb_crosscheck.py"
_spec = importlib.util.spec_from_file_location("kb_crosscheck", SCRIPT)
kbx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kbx)

CAND = """import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + {tag}
"""
BF16 = '''"""a bf16 problem with its own tolerance"""
import torch

DTYPE = "bfloat16"
ATOL = 3e-2
n = 64


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(n)]


def get_init_inputs():
    return []
'''


def _campaign(store: Store, name: str, pid: str, status: str, evals: list[tuple[str, dict]], bench: str | None = None):
    cfg = {"problem_ids": [pid], "small": False, **({"bench": {"config_hash": bench}} if bench else {})}
    cid = store.create_campaign(name, cfg, "NVIDIA H200", {})
    store.update_campaign(cid, status=status)
    for source, result in evals:
        cand = store.add_candidate(cid, pid, source, origin="seed")
        store.add_evaluation(cand, {"interpreted": False, "library_only": False, "own_kernel_share": 0.9, **result})
    return cid


def _ok(speedup: float) -> dict:
    return {"status": "correct", "median_ms": 1.0 / speedup, "eager_ms": 1.0, "speedup_eager": speedup,
            "speedup_compile": speedup / 2}


@pytest.fixture
def bench_db(tmp_path: Path) -> Path:
    db = tmp_path / "bench.db"
    store = Store(db)
    relu = store.add_problem(load_problem(ROOT / "tests" / "sandbox" / "problems" / "tiny_relu.py"))
    (tmp_path / "bf16_double.py").write_text(BF16)
    bf16 = store.add_problem(load_problem(tmp_path / "bf16_double.py"))
    _campaign(store, "relu-old", relu, "done", [(CAND.format(tag="1.0  # old"), _ok(1.5))])
    _campaign(store, "relu-new", relu, "done", [(CAND.format(tag="1.0  # slow"), _ok(1.1)),
                                                (CAND.format(tag="1.0  # new"), _ok(2.0))], bench="h1")
    _campaign(store, "relu-running", relu, "running", [(CAND.format(tag="1.0  # unfinished"), _ok(9.0))], bench="h1")
    _campaign(store, "bf16", bf16, "done", [(CAND.format(tag="0.0"), {"status": "incorrect", "error_class": "mismatch"})])
    store.close()
    return db


def test_winners_reads_each_problems_latest_finished_campaign(bench_db: Path) -> None:
    rows = kbx.winners(Store(bench_db))
    assert [r["problem"] for r in rows] == ["bf16_double", "tiny_relu"]
    bf16, relu = rows
    assert relu["campaign"] == "relu-new" and "# new" in relu["source"] and "class ModelNew" in relu["source"]
    assert relu["kernellab"]["correct"] and relu["kernellab"]["speedup_eager"] == 2.0 and relu["dtype"] == "float32"
    assert not bf16["kernellab"]["correct"] and bf16["source"] is None
    assert bf16["dtype"] == "bfloat16" and bf16["own_tolerance"] and not relu["own_tolerance"]
    assert [r["campaign"] for r in kbx.winners(Store(bench_db), config_hash="h1")] == ["relu-new"]
    assert kbx.winners(Store(bench_db), config_hash="other") == []
    assert [r["problem"] for r in kbx.winners(Store(bench_db), problems=["tiny_relu"])] == ["tiny_relu"]
    with pytest.raises(kbx.CrosscheckError, match="nope"):
        kbx.winners(Store(bench_db), problems=["nope"])


def test_a_library_only_winner_brings_the_best_own_kernel_candidate_along(tmp_path: Path) -> None:
    # on the H200 every level-1 GEMM's exported winner was the library-only candidate (1.00x), so the cross-check
    # judged cuBLAS while the bench counted the fused Triton seed as the correct own-kernel winner
    store = Store(tmp_path / "b.db")
    relu = store.add_problem(load_problem(ROOT / "tests" / "sandbox" / "problems" / "tiny_relu.py"))
    cid = store.create_campaign("relu", {"problem_ids": [relu], "small": False}, "NVIDIA H200", {})
    store.update_campaign(cid, status="done")
    lib = store.add_candidate(cid, relu, CAND.format(tag="1.0  # library"), origin="seed")
    store.add_evaluation(lib, {"interpreted": False, "library_only": True, "own_kernel_share": 0.0, **_ok(1.0)})
    own = store.add_candidate(cid, relu, CAND.format(tag="1.0  # own"), origin="seed")
    store.add_evaluation(own, {"interpreted": False, "library_only": False, "own_kernel_share": 0.9, **_ok(0.85)})
    rows = kbx.winners(store)
    assert [(r["winner"], r["kernellab"]["library_only"]) for r in rows] == [("exported", True), ("own-kernel", False)]
    assert "# library" in rows[0]["source"] and "# own" in rows[1]["source"]
    env = {"versions": {}, "date": "d", "device": "H200", "kernelbench_commit": "c", "kernelbench": "kb"}
    page = kbx.to_markdown({"db": "b.db", "settings": {}, "environment": env, "agreement": kbx.compare(rows),
                            "problems": rows})
    assert "the best own-kernel candidate" in page


def _row(name: str, kl_correct: bool, kb: dict | None, kl_speedup: float | None = None, source: str | None = "x") -> dict:
    return {"problem": name, "kernellab": {"correct": kl_correct, "status": "correct" if kl_correct else "no correct candidate",
                                           "speedup_eager": kl_speedup}, "kernelbench": kb, "source": source}


def test_a_kernelbench_copy_inside_another_repository_names_its_readme_commit(tmp_path: Path) -> None:
    """The .kb copy carried to the GPU host sits inside kernellab's checkout: its commit is its README's, not
    the outer repository's HEAD; a checkout of its own names its HEAD."""
    outer = tmp_path / "outer"
    kb = outer / ".kb"
    kb.mkdir(parents=True)
    (kb / "README.md").write_text("KernelBench at commit 423217d\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for repo in (outer, kb):
        subprocess.run([*git, "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(outer), "commit", "-q", "--allow-empty", "-m", "outer"], check=True)
    (kb / ".git").rename(tmp_path / "kb.git")  # a plain copy: no .git of its own
    assert kbx._kb_commit(kb) == "423217d"
    (tmp_path / "kb.git").rename(kb / ".git")
    subprocess.run([*git, "-C", str(kb), "commit", "-q", "--allow-empty", "-m", "kb"], check=True)
    head = subprocess.run(["git", "-C", str(kb), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert kbx._kb_commit(kb) == head != "423217d"


def test_compare_counts_every_kind_of_agreement() -> None:
    rows = [_row("a", True, {"compiled": True, "correctness": True, "speedup": 2.1, "seconds": 12.5}, 2.0),  # within 10%
            _row("b", True, {"compiled": True, "correctness": True, "speedup": 0.9, "seconds": 30.0,
                             "kept_from": "old.json"}, 1.3),  # agree, other side of 1x; judged by an earlier call
            _row("c", True, {"compiled": True, "correctness": False, "error": "max_difference: 0.3", "seconds": 7.5}, 1.5),
            _row("d", False, {"compiled": True, "correctness": True}),
            _row("e", False, None, source=None),  # nothing to export
            _row("f", True, {"compiled": None, "correctness": None, "error": "timed out"}, 1.2)]
    c = kbx.compare(rows)
    assert c["both_correct"] == 2 and c["kernellab_only_correct"] == 1 and c["kernelbench_only_correct"] == 1
    assert c["both_not_correct"] == 0 and c["no_winner"] == 1 and c["kernelbench_no_verdict"] == 1
    assert c["verdicts_compared"] == 4 and c["verdicts_agree"] == 2
    assert c["speedup_compared"] == 2 and c["speedup_same_side_of_1x"] == 1 and c["speedup_within_10pct"] == 1
    assert [r["agreement"] for r in rows] == ["both correct", "both correct", "kernellab only correct",
                                              "kernelbench only correct", "no winner", "no KernelBench verdict"]
    md = kbx.to_markdown({"db": "b.db", "settings": {}, "agreement": c, "problems": rows,
                          "environment": {"date": "d", "device": "H200", "versions": {"commit": "abc"},
                                          "kernelbench": "/kb", "kernelbench_commit": "423217d"}})
    assert "Verdicts agree on 2 of 4 winners" in md and "423217d" in md and "commit abc" in md
    assert "KernelBench ran 2 times here, 20 s in all (mean 10.0 s); 1 verdicts kept from earlier." in md
    assert "| c | correct | incorrect | 1.50x | - | kernellab only correct | max_difference: 0.3 |" in md


def test_the_largest_claimed_speedups_are_judged_first() -> None:
    rows = [_row("a", True, None, 1.0), _row("b", True, None, 5.9), _row("c", False, None),
            _row("d", True, None, 0.4), _row("e", True, None, 1.6), _row("f", True, None, 1.0)]
    assert [r["problem"] for r in kbx.judging_order(rows)] == ["b", "e", "a", "f", "d", "c"]


def _script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_stops_with_one_line(bench_db: Path, tmp_path: Path) -> None:
    fake_kb = tmp_path / "kb"
    (fake_kb / "src" / "kernelbench").mkdir(parents=True)
    (fake_kb / "src" / "kernelbench" / "eval.py").write_text("")
    for args, msg in ((["--db", str(tmp_path / "none.db")], "no such database"),
                      (["--db", str(bench_db), "--kernelbench", str(fake_kb)], "needs a CUDA device")):
        r = _script(*args, "--out-dir", str(tmp_path / "out"), cwd=tmp_path)
        assert r.returncode == 2 and msg in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.gpu
@pytest.mark.gpu_slow  # 225 s on the H200, the suite's longest case: with tests-slow, not in every GPU call
def test_crosscheck_end_to_end_on_gpu(tmp_path: Path) -> None:
    """A real bench on one problem, then KernelBench's own harness on its winner: both say correct."""
    kb = Path(os.environ.get("KERNELBENCH_DIR") or ROOT.parent / "shared" / "kernelbench")
    if not (kb / "src" / "kernelbench" / "eval.py").is_file():
        pytest.skip(f"no KernelBench at {kb}")
    suite = tmp_path / "one.txt"
    suite.write_text("experiments/problems/ops/softmax.py\n")
    db = tmp_path / "b.db"
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", "bench", str(suite), "--budget", "1", "--trials", "2",
                        "--debug-rounds", "0", "--db", str(db), "--out-dir", str(tmp_path / "res"), "--json"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "cross"
    r = _script("--db", str(db), "--kernelbench", str(kb), "--perf-trials", "10", "--out-dir", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(next(out.glob("*-kb-crosscheck.json")).read_text())
    assert result["agreement"]["both_correct"] == 1, result["problems"]
    assert result["problems"][0]["kernelbench"]["speedup"] > 0
    assert result["environment"]["kernelbench_commit"] != "unknown"


def test_keep_reuses_an_earlier_verdict_of_the_same_evaluation_only(bench_db: Path, tmp_path: Path) -> None:
    rows = kbx.winners(Store(bench_db))
    relu = next(r for r in rows if r["problem"] == "tiny_relu")
    earlier = tmp_path / "x.json"
    verdict = {"compiled": True, "correctness": True, "speedup": 1.9}
    failed = {"compiled": None, "correctness": None, "error": "crash"}
    other = {**relu, "kernellab": {**relu["kernellab"], "evaluation_id": "another"}}
    earlier.write_text(json.dumps({"problems": [{**relu, "kernelbench": verdict}, {**other, "kernelbench": failed}]}))
    kept = kbx.kept_verdicts(earlier)
    assert kept == {(relu["problem_id"], "exported", relu["kernellab"]["evaluation_id"]): verdict}
    with pytest.raises(kbx.CrosscheckError, match="no such file"):
        kbx.kept_verdicts(tmp_path / "nope.json")


def test_a_disagreement_gets_the_control_of_its_own_reference(tmp_path: Path) -> None:
    """The real kb_reference_control (a child process, here on the CPU) runs on the rows KernelBench's order may
    explain: kernellab correct and KernelBench not, or the harness raising; once per problem; the page says so."""
    incorrect = {"compiled": True, "correctness": False, "error": None}
    rows = [{**_row("drop", True, incorrect, 1.6), "problem_id": "p1", "reference": DROPOUT.replace("{p}", "0.5")},
            {**_row("drop", True, incorrect, 1.2), "problem_id": "p1", "reference": DROPOUT.replace("{p}", "0.5"),
             "winner": "own-kernel"},
            {**_row("nodrop", True, incorrect, 1.1), "problem_id": "p2", "reference": DROPOUT.replace("{p}", "0.0")},
            {**_row("targets", True, {"compiled": None, "correctness": None, "error": "NotImplementedError: Float",
                                      "harness_raised": True}, 2.0), "problem_id": "p3", "reference": TARGETS},
            {**_row("crashed", True, {"compiled": None, "correctness": None, "error": "process ended"}, 2.0),
             "problem_id": "p4", "reference": "raise SystemExit('never run')"},
            {**_row("agree", True, {"compiled": True, "correctness": True, "speedup": 1.0}, 1.0),
             "problem_id": "p5", "reference": "raise SystemExit('never run')"}]
    c = kbx.compare(rows)
    kbx.reference_controls(rows, "cpu")
    c["reference_fails_kernelbench"] = kbx.reference_fails(rows)
    assert c["reference_fails_kernelbench"] == 2  # the dropout and the targets problems, not the plain one
    drop, own, plain, targets, crashed, agree = (r.get("reference_control") for r in rows)
    assert drop is own and drop["passes"] is False and all(t["max_diff"] > 1e-4 and t["reseeded_equal"]
                                                           for t in drop["trials"]), drop
    assert plain["passes"] is True, plain
    assert targets["passes"] is False and all("error" in t for t in targets["trials"]), targets
    assert crashed is None and agree is None
    md = kbx.to_markdown({"db": "b.db", "settings": {}, "agreement": c, "problems": rows,
                          "environment": {"date": "d", "device": "H200", "versions": {},
                                          "kernelbench": "/kb", "kernelbench_commit": "x"}})
    assert "2 of the disagreeing or unjudged problems are ones whose own reference fails KernelBench's order" in md
    assert "the problem's own reference fails KernelBench's order in 2 of 2 trials" in md
    assert "the problem's own reference raises in KernelBench's order: " in md
    assert "the problem's own reference passes KernelBench's order" in md
    # a harness exception is kept by --keep (it recurs on the same file); a crash is run again
    earlier = tmp_path / "x.json"
    keyed = [{**r, "kernellab": {**r["kernellab"], "evaluation_id": r["problem"]}} for r in rows]
    earlier.write_text(json.dumps({"problems": keyed}))
    assert {k[2] for k in kbx.kept_verdicts(earlier)} == {"drop", "nodrop", "targets", "agree"}


# -- --jobs: KernelBench runs side by side, taking turns on the GPU -----------------------------------------
def _held_elsewhere(path: Path) -> bool:
    """Whether another open file description holds ``path``'s flock now (what a second child would see)."""
    import fcntl

    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_a_gpu_turn_is_given_up_only_while_inputs_are_drawn(tmp_path: Path) -> None:
    lock = tmp_path / "gpu.lock"
    turn = kbx._GpuTurn(str(lock))
    seen = []

    def get_inputs() -> list:
        seen.append(_held_elsewhere(lock))
        return [torch.rand(4)]

    turn.acquire()
    assert _held_elsewhere(lock)
    drawn = turn.around_inputs(get_inputs)()
    assert seen == [False] and _held_elsewhere(lock) and not turn.device_inputs and drawn[0].shape == (4,)
    # inputs made on a device were made outside the turn: the parent judges that run again alone
    turn.around_inputs(lambda: [torch.empty(2, device="meta")])()
    assert turn.device_inputs and kbx.alone_reason({"device_inputs": True})
    turn.release()
    assert not _held_elsewhere(lock)


KB_DIR = Path(os.environ.get("KERNELBENCH_DIR") or ROOT.parent / "shared" / "kernelbench")


@pytest.mark.skipif(not (KB_DIR / "src" / "kernelbench" / "eval.py").is_file(), reason=f"no KernelBench at {KB_DIR}")
def test_kernelbenchs_own_loader_hands_out_the_turn_taking_get_inputs(tmp_path: Path) -> None:
    # KernelBench's 19_ReLU at a tiny size, its get_inputs() reporting whether the GPU's turn is free while it
    # draws; in a child, since KernelBench's import puts stand-ins for openai and litellm in sys.modules
    lock = tmp_path / "gpu.lock"
    src = (KB_DIR / "level1" / "19_ReLU.py").read_text()
    src = src.replace("batch_size = 4096", "batch_size = 2").replace("dim = 393216", "dim = 8") + f"""
import fcntl as _fcntl
_drawn = get_inputs
def get_inputs():
    with open({str(lock)!r}, "a") as f:
        try:
            _fcntl.flock(f, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
            _fcntl.flock(f, _fcntl.LOCK_UN)
            print("inside: free")
        except BlockingIOError:
            print("inside: held")
    return _drawn()
"""
    (tmp_path / "problem.py").write_text(src)
    code = f"""
import fcntl, importlib.util
from pathlib import Path
spec = importlib.util.spec_from_file_location("kbx", {str(SCRIPT)!r})
kbx = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kbx)
kb_eval = kbx.import_kernelbench(Path({str(KB_DIR)!r}))
turn = kbx._GpuTurn({str(lock)!r})
kbx._take_turns(kb_eval, turn)
turn.acquire()
model, get_init_inputs, get_inputs = kb_eval.load_original_model_and_inputs(
    Path({str(tmp_path / "problem.py")!r}).read_text(), {{}})
x = get_inputs()
with open({str(lock)!r}, "a") as f:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("after: free")
    except BlockingIOError:
        print("after: held")
print("inputs", tuple(x[0].shape), turn.device_inputs)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["inside: free", "after: held", "inputs (2, 8) False"], r.stdout


def _rows(n: int) -> list[dict]:
    return [{"problem": f"p{i}"} for i in range(n)]


def test_judge_all_runs_side_by_side_and_judges_an_out_of_memory_again_alone() -> None:
    # `run` stands in for KernelBench's child (CUDA-only); judge_all's own scheduling is what runs here
    import threading
    import time

    live, most, calls = [0], [0], []
    guard = threading.Lock()

    def run(row: dict, turn: str | None) -> dict:
        with guard:
            live[0] += 1
            most[0] = max(most[0], live[0])
            calls.append((row["problem"], turn))
        time.sleep(0.2)
        with guard:
            live[0] -= 1
        if row["problem"] == "p2" and turn is not None:
            return {"correctness": False, "error": "runtime_error: CUDA out of memory. Tried to allocate 6.00 GiB"}
        return {"correctness": True, "seconds": 0.2}

    rows = _rows(6)
    assert kbx.judge_all(rows, run, 3, "/tmp/turn.lock") is False
    assert most[0] == 3 and [t for _, t in calls[:6]] == ["/tmp/turn.lock"] * 6
    assert calls[6:] == [("p2", None)]  # alone, after the others
    assert rows[2]["kernelbench"] == {"correctness": True, "seconds": 0.2,
                                      "rerun_alone": "out of memory beside other KernelBench runs"}
    assert all(r["kernelbench"]["correctness"] for r in rows)
    # one at a time: no turns to take, nothing judged twice
    calls.clear()
    rows = _rows(3)
    assert kbx.judge_all(rows, run, 1, "/tmp/turn.lock") is False
    assert calls == [("p0", None), ("p1", None), ("p2", None)]


def test_judge_all_admits_host_memory_a_big_run_alone_and_small_ones_together() -> None:
    # needs in GB against a 10 GB budget (the sandbox's MemoryBudget): the 6s never together, a 12 alone, the 1s
    # beside anything that fits; an unknown need alone too
    import threading
    import time

    gb = 10**9
    needs = {"p0": 6, "p1": 6, "p2": 12, "p3": 1, "p4": 1, "p5": None, "p6": 6}
    live: dict[str, int] = {}
    seen: list[tuple[int, int]] = []  # (bytes held, children) whenever one starts
    starts: dict[str, int] = {}  # children running when each started, itself included
    guard = threading.Lock()

    def run(row: dict, turn: str | None) -> dict:
        with guard:
            live[row["problem"]] = (needs[row["problem"]] or 3) * gb
            seen.append((sum(live.values()), len(live)))
            starts[row["problem"]] = len(live)
        time.sleep(0.15)
        with guard:
            del live[row["problem"]]
        return {"correctness": True}

    rows = [{"problem": p} for p in needs]
    from kernellab.sandbox._gpu import MemoryBudget

    admission = MemoryBudget(10 * gb)
    need = lambda r: None if needs[r["problem"]] is None else needs[r["problem"]] * gb  # noqa: E731
    assert kbx.judge_all(rows, run, 4, "/tmp/turn.lock", admission=admission, need=need) is False
    assert len(seen) == 7 and all(held <= 10 * gb or n == 1 for held, n in seen)
    assert (12 * gb, 1) in seen  # the big one ran, and alone
    assert starts["p5"] == 1  # so did the one of unknown need
    assert max(n for _, n in seen) >= 2  # small ones did run side by side
    assert admission.used == 0 and admission.jobs == 0
    got = {r["problem"]: r["kernelbench"] for r in rows}
    assert got["p2"]["host_need_gb"] == 12.0 and got["p5"]["host_need_gb"] is None
    assert all(v["correctness"] and v["host_wait_s"] >= 0 for v in got.values())
    waited = [v["host_wait_s"] for v in got.values()]
    assert max(waited) >= 0.1  # someone waited for another's memory
    assert "waiting for host memory" in kbx._cost_line([{"kernelbench": {**v, "seconds": 0.15}} for v in got.values()],
                                                        1.0, 4)


def test_host_need_of_a_kernelbench_file_at_full_size() -> None:
    src = (ROOT / "tests" / "problems" / "kb_gemm_add_relu.py").read_text()
    need = kbx.host_need({"problem": "g", "reference": src, "small": True})  # judged at full size all the same
    full = kbx.host_need({"problem": "g", "reference": src})
    assert need == full and need > 10**6
    assert kbx.host_need({"problem": "bad", "reference": "this is not python"}) is None
    assert kbx.host_admission().budget >= 1
    gib = 2**30
    assert kbx.host_admission(16 * gib).budget <= 4 * gib  # at most half of a 16 GiB card, less 4 GiB
    none = kbx.host_admission(8 * gib)  # nothing beside another: every child alone
    assert none.budget == 1 and none.admit(10**9) == (1, True) and not none.fits_now(1)
    none.release(1)


# a child with Python's own SIGINT handler, the script loaded as kbx: this process may hold kernellab's handler (an
# in-process CLI test's), whose stop a real SIGINT here would set off
_JUDGE_ALL_CHILD = f"""
import importlib.util, json, os, signal, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)
spec = importlib.util.spec_from_file_location("kbx", {str(SCRIPT)!r})
kbx = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kbx)
"""


def test_judge_all_interrupted_keeps_only_the_verdicts_finished_before(tmp_path: Path) -> None:
    code = _JUDGE_ALL_CHILD + f"""
def run(row, turn):
    if row["problem"] != "p0":
        time.sleep(1.5)  # still running at the interrupt
    return {{"correctness": True}}

rows = [{{"problem": f"p{{i}}"}} for i in range(4)]
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
stopped = kbx.judge_all(rows, run, 2, {str(tmp_path / "turn.lock")!r})
print(json.dumps({{"stopped": stopped, "s": time.monotonic() - t0, "rows": rows}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["stopped"] is True and out["s"] < 3.0, out  # the runs not started were cancelled
    assert out["rows"][0]["kernelbench"] == {"correctness": True}
    assert ["kernelbench" in row for row in out["rows"][1:]] == [False, False, False]


def test_judge_all_survives_a_burst_of_interrupts(tmp_path: Path) -> None:
    # SIGINTs one after another while it waits and while it stops its runs: each used to raise where it landed
    # (once inside a lock's release, on the H200: "release unlocked lock"), past the stop; now it returns
    code = _JUDGE_ALL_CHILD + f"""
over = threading.Event()

def run(row, turn):
    over.wait(30)  # running until the burst is over: no SIGINT comes after judge_all returns
    time.sleep(0.1)
    return {{"correctness": True}}

def burst():
    time.sleep(0.3)
    for _ in range(100):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.002)
    over.set()

rows = [{{"problem": f"p{{i}}"}} for i in range(6)]
threading.Thread(target=burst, daemon=True).start()
stopped = kbx.judge_all(rows, run, 2, {str(tmp_path / "turn.lock")!r})
print(json.dumps({{"stopped": stopped, "handler": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
                  "rows": rows}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["stopped"] is True and out["handler"] is True, out
    assert not any("kernelbench" in row for row in out["rows"]), out  # stopped mid-run: no verdict kept
