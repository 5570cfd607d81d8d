"""`kernellab bench` on the CPU: a campaign per problem of the ci suite, honest summary, result files."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernellab.bench import suite_paths, summarize, to_markdown


def test_suite_paths_and_errors(tmp_path: Path) -> None:
    assert len(suite_paths("ci")) >= 3
    assert len(suite_paths("full")) >= 30
    with pytest.raises(FileNotFoundError, match="no suite"):
        suite_paths("no-such-suite")
    f = tmp_path / "s.txt"
    f.write_text("experiments/problems/ops/softmax.py\nexperiments/problems/ops/nope.py\n")
    with pytest.raises(FileNotFoundError, match="nope.py"):
        suite_paths(str(f))


def _row(name: str, correct: bool, se: float | None, sc: float | None, interpreted: bool = False) -> dict:
    return {"problem": name, "correct": correct, "speedup_eager": se, "speedup_compile": sc,
            "interpreted": interpreted, "failures": {} if correct else {"mismatch": 2}}


def test_fast_p_counts_all_problems() -> None:
    rows = [_row("a", True, 2.5, 1.2), _row("b", True, 1.2, 0.8), _row("c", False, None, None),
            _row("d", True, 0.5, 0.4)]
    s = summarize(rows)
    assert s["fast_0_eager"] == 0.75  # correct
    assert s["fast_1_eager"] == 0.5 and s["fast_1_compile"] == 0.25
    assert s["fast_2_eager"] == 0.25 and s["fast_1.5_compile"] == 0.0
    assert s["geomean_eager_correct"] == pytest.approx((2.5 * 1.2 * 0.5) ** (1 / 3))
    assert s["geomean_eager_all"] == pytest.approx((2.5 * 1.2 * 1.0 * 0.5) ** (1 / 4))
    assert s["failures"] == {"mismatch": 2}


def test_interpreted_runs_claim_no_speedup() -> None:
    s = summarize([{**_row("a", True, None, None, interpreted=True), "eager_ms": 3.0, "compile_ms": None}])
    assert s["interpreted"] and s["fast_0_eager"] == 1.0 and s["fast_1_eager"] is None
    assert s["geomean_eager_all"] is None
    md = to_markdown({"suite": "x", "date": "d", "device": "cpu", "versions": {}, "config": {},
                      "summary": s, "problems": []})
    assert "no speedup is claimed" in md
    # torch.compile was never timed: nothing under its column, not even fast_0; no "kernel win" claimed
    assert s["fast_0_compile"] is None and "| fast_0 | 1.00 | - |" in md, md
    assert "kernel win" not in md and "1/1 problems with a correct candidate that launches its own kernels" in md


def test_bench_cli_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", "bench", "ci", "--small", "--budget", "2",
                        "--trials", "2", "--width", "2", "--jobs", "2", "--db", str(tmp_path / "b.db"),
                        "--out-dir", str(out), "--json"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    n = len(suite_paths("ci"))
    assert result["summary"]["problems"] == n and result["complete"]
    assert result["summary"]["correct"] == n, [p for p in result["problems"] if not p["correct"]]
    assert result["summary"]["interpreted"] and result["summary"]["fast_1_eager"] is None
    for p in result["problems"]:
        assert p["speedup_eager"] is None and p["actions"] and p["evaluations"] >= 1
    files = sorted(out.iterdir())
    assert [f.suffix for f in files] == [".json", ".md"]
    assert json.loads(files[0].read_text())["summary"] == result["summary"]
    # the pace of the call: on the page, and a line as each problem ends (no GPU here: nothing said of one)
    pace = result["pace"]
    assert pace["problems_done"] == n and pace["wall_s"] > 0 and pace["problems_per_hour"] > 0
    assert pace["evaluations"] >= sum(p["evaluations"] for p in result["problems"])
    assert pace["gpus"] == 0 and pace["evaluations_per_gpu_hour"] is None and pace["gpu_busy_share"] is None
    assert r.stderr.count("bench: pace: ") == n + 1 and "GPU busy" not in r.stderr, r.stderr[-2000:]
    assert "## Pace of this call" in files[1].read_text()


# -- whole-suite scoring, kernel wins, incremental and sharded runs -----------------------------------------

from kernellab import load_problem  # noqa: E402
from kernellab.bench import (  # noqa: E402
    BenchError,
    bench_config,
    bench_summary,
    config_hash,
    parse_shard,
    problem_row,
    run_bench,
    shard_indices,
)
from kernellab.fileio import write_atomic  # noqa: E402
from kernellab.problem import ProblemError  # noqa: E402
from kernellab.progress import Progress  # noqa: E402
from kernellab.store import Store  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# a tiny suite: sorted by path, fusions/pointwise_chain is rank 0 and ops/softmax rank 1
TINY = ["experiments/problems/ops/softmax.py", "experiments/problems/fusions/pointwise_chain.py"]
TINY_KW = {"budget": 1, "trials": 1, "width": 1, "debug_rounds": 0, "device": "cpu", "small": True}


def test_suite_from_folder_glob_and_list(tmp_path: Path) -> None:
    folder = suite_paths(str(ROOT / "experiments" / "problems" / "ops"))
    assert folder and all(p.parent.name == "ops" for p in folder) and folder == sorted(folder)
    assert suite_paths(str(ROOT / "experiments" / "problems" / "ops" / "*.py")) == folder
    assert suite_paths("experiments/problems/ops/soft*.py")[0].name == "softmax.py"
    with pytest.raises(FileNotFoundError, match="matches no"):
        suite_paths(str(tmp_path / "*.py"))
    (tmp_path / "p.py").write_text((ROOT / TINY[0]).read_text())
    lst = tmp_path / "list.txt"
    lst.write_text("p.py  # next to the list file\n" + TINY[1] + "\n")
    assert [p.name for p in suite_paths(str(lst))] == ["p.py", "pointwise_chain.py"]
    # one problem file is a suite of one (it was read as a list of its own source lines)
    assert suite_paths(str(tmp_path / "p.py")) == [tmp_path / "p.py"]


def test_shard_syntax_and_split_covers_every_problem_once() -> None:
    assert parse_shard(None) is None and parse_shard("1/3") == (1, 3) and parse_shard(" 0 / 1 ") == (0, 1)
    for bad in ("3/3", "1", "a/b", "-1/2", "1/0", "0/2/3"):
        with pytest.raises(BenchError, match="expected I/N"):
            parse_shard(bad)
    paths = suite_paths("full")
    for n in (1, 2, 3, 7, len(paths) + 2):
        shards = [shard_indices(paths, (i, n)) for i in range(n)]
        flat = [k for s in shards for k in s]
        assert sorted(flat) == list(range(len(paths))), n  # every problem exactly once
        assert max(map(len, shards)) - min(map(len, shards)) <= 1  # balanced
    # the split depends on the paths relative to their common folder, not on where the repository lies
    moved = [Path("/elsewhere/repo") / p.relative_to(ROOT) for p in paths]
    assert shard_indices(moved, (1, 3)) == shard_indices(paths, (1, 3))


def test_bad_shard_and_several_dbs_are_one_line_usage_errors(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from kernellab.cli import main

    monkeypatch.chdir(tmp_path)
    for args, msg in ((["--shard", "2/2"], "--shard '2/2': expected I/N"),
                      (["--db", "a.db", "--db", "b.db"], "only with --summary-only"),
                      (["--policy", "nope", "--db", "c.db"], "--policy 'nope'"),
                      (["--rerun", "x", "--summary-only"], "--rerun runs problems; --summary-only runs nothing"),
                      (["--rerun", "nope", "--db", "d.db"], "--rerun nope: not a problem of ci")):
        r = CliRunner().invoke(main, ["bench", "ci", *args, "--out-dir", "out"])
        assert r.exit_code == 2 and r.stderr.strip().count("\n") == 0 and msg in r.stderr, r.stderr
        assert not (tmp_path / "kernellab.db").exists() and not (tmp_path / "a.db").exists()
        assert not (tmp_path / "out").exists()  # bad input writes no result file


def test_config_hash_covers_what_changes_results() -> None:
    base = bench_config(TINY_KW)
    assert config_hash(base) == config_hash(bench_config(dict(TINY_KW)))
    for change in ({"budget": 2}, {"trials": 2}, {"policy": "beam"}, {"llm": "anthropic:x"}, {"small": False},
                   {"objective": "speedup_compile"}, {"seed": 1}):
        assert config_hash(bench_config({**TINY_KW, **change})) != config_hash(base), change
    # "auto" is resolved as the campaign resolves it: on this machine the same run as --device cpu --small
    if not torch_cuda():
        assert config_hash(bench_config({**TINY_KW, "device": None, "small": None})) == config_hash(base)


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_fast_p_is_over_the_whole_suite_with_unfinished_problems_counted() -> None:
    rows = [_row("a", True, 2.5, 1.2), _row("b", True, 1.2, 0.8),
            {**_row("c", True, 3.0, 3.0), "finished": False},  # interrupted: its partial best must not count
            {**_row("d", False, None, None), "finished": False, "failures": {}}]
    s = summarize(rows)
    assert s["problems"] == 4 and s["finished"] == 2 and s["correct"] == 2
    assert s["fast_0_eager"] == 0.5 and s["fast_1_eager"] == 0.5 and s["fast_2_eager"] == 0.25
    assert s["fast_1_compile"] == 0.25 and s["fast_2_compile"] == 0.0
    assert s["geomean_eager_all"] == pytest.approx((2.5 * 1.2) ** (1 / 4))
    assert s["geomean_eager_correct"] == pytest.approx((2.5 * 1.2) ** 0.5)
    timed = {"median_ms": 1.0, "p20_ms": 0.9, "p80_ms": 1.1, "eager_ms": 2.0, "compile_ms": 1.5,
             "evaluations_to_best": 1, "seconds_to_best": 1.0, "actions": ["(seed)"]}
    md = to_markdown({"suite": "x", "date": "d", "device": "gpu", "versions": {}, "config": {}, "summary": s,
                      "problems": [{**timed, **r} for r in rows]})
    assert "2 of 4 problems finished" in md and "counts as not correct" in md
    assert "| c | not finished" in md


def _store_with_one_correct(share: float, library_only: bool, interpreted: bool = False) -> tuple[Store, str]:
    store = Store(":memory:")
    prob = load_problem(ROOT / "tests" / "sandbox" / "problems" / "tiny_relu.py")
    pid = store.add_problem(prob)
    cid = store.create_campaign("c", {"problem_ids": [pid]}, "NVIDIA H200", {})
    store.update_campaign(cid, status="done")
    cand = store.add_candidate(cid, pid, "class ModelNew: pass\n", origin="seed")
    store.add_evaluation(cand, {"status": "correct", "median_ms": 1.0, "p20_ms": 0.9, "p80_ms": 1.1, "eager_ms": 3.0,
                                "compile_ms": 2.0, "speedup_eager": 3.0, "speedup_compile": 2.0,
                                "own_kernel_share": share, "library_only": library_only, "interpreted": interpreted})
    return store, cid


@pytest.mark.parametrize("share,library_only,counted,reason", [
    (0.9, False, True, None), (0.5, False, True, None), (0.3, False, False, "low_share"),
    (0.0, True, False, "library_only")])
def test_only_kernel_wins_count_in_fast_p(share: float, library_only: bool, counted: bool, reason: str | None) -> None:
    store, cid = _store_with_one_correct(share, library_only)
    row = problem_row(store, cid)
    assert row["finished"] and row["correct"] is counted
    assert (row["not_counted"] or {}).get("reason") == reason
    s = summarize([row])
    assert s["fast_1_eager"] == (1.0 if counted else 0.0) and s["not_counted"] == (0 if counted else 1)
    md = to_markdown({"suite": "x", "date": "d", "device": "gpu", "versions": {}, "config": {}, "summary": s,
                      "problems": [row]})
    assert ("not counted" in md) is not counted
    assert problem_row(store, cid, allow_library=True)["correct"]


def test_the_winner_is_the_best_kernel_win_and_its_missing_retiming_resumes_the_campaign() -> None:
    """A faster candidate that is mostly library time does not hide a correct one of our own: ours is the
    problem's winner (slower, counted, reported). A finished campaign whose winners lack a re-timing (the
    kernel win's, where an older campaign re-timed only the fastest) is resumed for it; re-timed, skipped."""
    from kernellab.bench import _plan, _Rows
    from kernellab.store import WINNER_RETIME

    path = ROOT / "tests" / "sandbox" / "problems" / "tiny_relu.py"
    prob = load_problem(path)
    store = Store(":memory:")
    pid = store.add_problem(prob)
    cid = store.create_campaign("c", {"problem_ids": [pid], "objective": "speedup_eager",
                                      "bench": {"config_hash": "h"}}, "NVIDIA H200", {})
    store.update_campaign(cid, status="done")
    timed = {"status": "correct", "p20_ms": 0.9, "p80_ms": 1.1, "eager_ms": 1.0, "compile_ms": 1.0,
             "interpreted": False, "library_only": False}
    lib = store.add_candidate(cid, pid, "class ModelNew: pass  # cudnn and an epilogue\n", origin="seed")
    own = store.add_candidate(cid, pid, "class ModelNew: pass  # ours\n", origin="seed")
    store.add_evaluation(lib, {**timed, "median_ms": 0.5, "speedup_eager": 2.0, "speedup_compile": 2.0,
                               "own_kernel_share": 0.1})
    store.add_evaluation(own, {**timed, "median_ms": 1.25, "speedup_eager": 0.8, "speedup_compile": 0.8,
                               "own_kernel_share": 0.9})
    row = problem_row(store, cid)
    assert row["correct"] and row["candidate_id"] == own and row["speedup_eager"] == 0.8 and not row["retimed"]
    assert summarize([row])["fast_0_eager"] == 1.0 and summarize([row])["fast_1_eager"] == 0.0
    assert problem_row(store, cid, allow_library=True)["candidate_id"] == lib
    reader = _Rows([store], [prob], [path], "h", "speedup_eager", False)
    assert _plan(reader, [prob], [0]) == ([(0, cid)], 0, 1, {})  # resumed: its winners were never re-timed
    for cand, ms, share in ((lib, 0.5, 0.1), (own, 1.25, 0.9)):
        store.add_evaluation(cand, {**timed, "median_ms": ms, "speedup_eager": 1.0 / ms, "own_kernel_share": share,
                                    "details": {WINNER_RETIME: {"band": {}}}}, kind="retime")
    assert _plan(reader, [prob], [0]) == ([], 1, 0, {})
    row = problem_row(store, cid)
    assert row["retimed"] and row["candidate_id"] == own and row["speedup_eager"] == 0.8


def _one_problem_benched(tmp_path: Path) -> tuple[Path, Path, Store, dict]:
    """A one-problem suite benched on the CPU: (suite file, database, its store, the campaign)."""
    suite = tmp_path / "one.txt"
    suite.write_text(TINY[0] + "\n")
    db = tmp_path / "b.db"
    store = Store(db)
    run_bench(str(suite), store, TINY_KW, out_dir=tmp_path / "out")
    (camp,) = store.list_campaigns()
    return suite, db, store, camp


def test_a_finished_campaign_is_resumed_for_its_missing_retiming_alone(tmp_path: Path) -> None:
    """End to end on the CPU: a finished bench campaign whose winner (here a library-only candidate, written after
    it finished, as the older rule left such winners) was never re-timed is run again by the next bench call for
    that re-timing alone (no new candidate, one re-timing job through the real sandbox); the call after skips it."""
    from kernellab.store import WINNER_RETIME

    suite, db, store, camp = _one_problem_benched(tmp_path)
    pid = camp["config"]["problem_ids"][0]
    ours = store.best(camp["id"], pid, kernel=True)[0]
    # torch's own softmax as a candidate: library-only, and (as recorded) the fastest
    lib = store.add_candidate(camp["id"], pid, "import torch\n\n\nclass ModelNew(torch.nn.Module):\n"
                              "    def forward(self, x):\n        return torch.softmax(x, dim=-1)\n", origin="human")
    store.add_evaluation(lib, {"status": "correct", "median_ms": (ours["median_ms"] or 1.0) / 10, "interpreted": True,
                               "library_only": True, "device": "cpu"}, kind="full")
    assert store.best(camp["id"], pid)[0]["candidate_id"] == lib
    before = len(store.candidates(camp["id"]))
    result, _, _ = run_bench(str(suite), store, TINY_KW, out_dir=tmp_path / "out")
    retimes = [e for e in store.evaluations(candidate_id=lib, kind="retime") if (e["details"] or {}).get(WINNER_RETIME)]
    assert len(retimes) == 1 and retimes[0]["library_only"], retimes
    assert len(store.candidates(camp["id"])) == before and store.get_campaign(camp["id"])["status"] == "done"
    (row,) = result["problems"]
    assert row["correct"] and row["candidate_id"] == ours["candidate_id"]  # the kernel win is still the winner
    # the call's pace: one re-timing evaluated, no problem finished by it
    assert result["pace"]["problems_done"] == 0 and result["pace"]["evaluations"] == 1, result["pace"]
    n = len(store.evaluations(campaign_id=camp["id"]))
    run_bench(str(suite), store, TINY_KW, out_dir=tmp_path / "out")
    assert len(store.evaluations(campaign_id=camp["id"])) == n  # nothing missing now: skipped
    store.close()


@pytest.mark.parametrize("recorded,here,ok", [
    ("NVIDIA H200", "NVIDIA H200", True), ("NVIDIA H200", "NVIDIA H100 80GB HBM3", False),
    ("NVIDIA H200", "cpu (x86_64, Triton interpreter)", False), ("cpu (, Triton interpreter)", "cpu (x86_64, Triton interpreter)", True),
    (None, "NVIDIA H200", True)])
def test_timings_compare_on_one_gpu_model(recorded, here, ok) -> None:
    from kernellab.env import timings_compare

    assert timings_compare(recorded, here) is ok


def test_a_suite_database_from_another_device_is_not_resumed_here(tmp_path: Path) -> None:
    """A session that got an H100 where the suite's database holds H200 results must not resume its campaigns
    (each picks its winner over medians of both) nor add to it; a page of what is finished is still written."""
    import sqlite3

    from kernellab.bench import BenchError
    from kernellab.campaign import CampaignError, resume_campaign

    suite, db, store, camp = _one_problem_benched(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE campaigns SET device = 'NVIDIA H200'")
    n = len(store.evaluations(campaign_id=camp["id"]))
    result, _, _ = run_bench(str(suite), store, TINY_KW, out_dir=tmp_path / "out")  # nothing to run: the page
    assert result["devices_of_results"] == ["NVIDIA H200"]
    store.update_campaign(camp["id"], status="stopped")
    with pytest.raises(BenchError, match="NVIDIA H200 and this host's device is cpu"):
        run_bench(str(suite), store, TINY_KW, out_dir=tmp_path / "out")
    with pytest.raises(CampaignError, match="ran on NVIDIA H200"):
        resume_campaign(store, camp["id"])
    assert len(store.evaluations(campaign_id=camp["id"])) == n and len(store.list_campaigns()) == 1
    assert store.get_campaign(camp["id"])["status"] == "stopped"
    store.close()


def test_write_atomic(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "r.json"
    write_atomic(out, '{"a": 1}')
    assert out.read_text() == '{"a": 1}' and (out.stat().st_mode & 0o777) != 0o600
    with pytest.raises(TypeError):
        write_atomic(out, 12345)  # fails mid-write: the old file stays whole, no temp file is left
    assert out.read_text() == '{"a": 1}' and sorted(x.name for x in out.parent.iterdir()) == ["r.json"]
    write_atomic(out, b"new")
    assert out.read_bytes() == b"new"


class _Killed(BaseException):
    """A kill -9 stand-in: nothing catches it on the way out."""


class _Watch(Progress):
    """The real progress hooks, counting evaluations; optionally 'killed' after the first one of a problem."""

    def __init__(self, kill_in: str | None = None):
        super().__init__(enabled=False)
        self.kill_in, self.evaluated = kill_in, 0

    def on_evaluation(self, result: dict) -> None:
        super().on_evaluation(result)
        self.evaluated += 1
        if self.kill_in and self.stats.problem == self.kill_in:
            raise _Killed()


def _counts(db: Path) -> dict:
    import sqlite3

    with sqlite3.connect(db) as c:
        out = {t: c.execute(f"select count(*) from {t}").fetchone()[0]
               for t in ("campaigns", "candidates", "evaluations", "events")}
        # a campaign re-times its winner when it ends: a resumed one adds that evaluation, and only that
        out["searched"] = c.execute("select count(*) from evaluations where "
                                    "json_extract(details_json, '$.winner_retime') is null").fetchone()[0]
        return out


def _strip(result: dict) -> dict:
    # the pace is this call's own (a rerun that does nothing has none): the suite's score is the rest
    return {k: v for k, v in result.items() if k not in ("date", "versions", "pace")}


def test_interrupted_bench_rerun_repeats_nothing_and_shards_merge(tmp_path: Path) -> None:
    suite = tmp_path / "tiny.txt"
    suite.write_text("\n".join(TINY) + "\n")
    db, out = tmp_path / "a.db", tmp_path / "out"
    store = Store(db)
    lines: list[str] = []

    # shard 0/2 runs pointwise_chain only; the result is scored over the whole suite
    r0, jpath, _ = run_bench(str(suite), store, TINY_KW, out_dir=out, shard=(0, 2), log=lines.append)
    assert r0["problems_total"] == 2 and r0["problems_finished"] == 1 and not r0["complete"]
    assert {p["problem"]: p["state"] for p in r0["problems"]} == {"softmax": "not run", "pointwise_chain": "done"}
    assert r0["summary"]["fast_0_eager"] == 0.5 and "-shard0of2" in jpath.name
    shard0 = tmp_path / "shard0.db"
    store.close()
    import shutil

    shutil.copy(db, shard0)
    store = Store(db)

    # the full suite is 'killed' in softmax's campaign right after its first evaluation was recorded
    with pytest.raises(_Killed):
        run_bench(str(suite), store, TINY_KW, out_dir=out, progress=_Watch(kill_in="softmax"), log=lines.append)
    camps = {c["name"].split("-")[2]: c for c in store.list_campaigns()}
    assert set(camps) == {"softmax", "pointwise_chain"} and camps["softmax"]["status"] == "stopped"
    on_disk = json.loads(jpath.with_name(jpath.name.replace("-shard0of2", "")).read_text())  # whole, atomic
    assert on_disk["problems_finished"] == 1

    # the rerun skips pointwise_chain, resumes softmax's campaign and evaluates nothing again
    before = _counts(db)
    watch = _Watch()
    r1, _, _ = run_bench(str(suite), store, TINY_KW, out_dir=out, progress=watch, log=lines.append)
    assert watch.evaluated == 0
    assert _counts(db)["campaigns"] == before["campaigns"] and _counts(db)["searched"] == before["searched"]
    assert store.get_campaign(camps["softmax"]["id"])["status"] == "done"
    assert r1["complete"] and r1["summary"]["correct"] == 2 and r1["summary"]["fast_0_eager"] == 1.0
    assert any("1 skipped as finished, 1 resumed" in m for m in lines), lines

    # once everything finished, a rerun touches nothing and scores the same
    before = _counts(db)
    watch = _Watch()
    r2, _, _ = run_bench(str(suite), store, TINY_KW, out_dir=out, progress=watch, log=lines.append)
    assert watch.evaluated == 0 and _counts(db) == before and _strip(r2) == _strip(r1)
    assert lines[-2].startswith("bench: 2/2 done, 2 skipped as finished; 2 of 2 problems")
    assert lines[-1].startswith("bench: pace: 0 problems")  # this call's pace: it did nothing

    # a different configuration is a different bench: nothing of the above is reused
    r3 = bench_summary(str(suite), [store], {**TINY_KW, "trials": 2}, out_dir=out)[0]
    assert r3["problems_finished"] == 0 and r3["summary"]["fast_0_eager"] == 0.0

    # shard 1/2 into its own database; the two shard databases together score like the full one
    shard1 = Store(tmp_path / "shard1.db")
    run_bench(str(suite), shard1, TINY_KW, out_dir=out, shard=(1, 2))
    merged = bench_summary(str(suite), [Store(shard0), shard1], TINY_KW, out_dir=out)[0]
    assert merged["complete"] and merged["summary"] == r1["summary"]
    assert [p["problem"] for p in merged["problems"]] == [p["problem"] for p in r1["problems"]]
    # the same through the command line
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", "bench", str(suite), "--summary-only", "--db", str(shard0),
                        "--db", str(tmp_path / "shard1.db"), "--budget", "1", "--trials", "1", "--width", "1",
                        "--debug-rounds", "0", "--device", "cpu", "--small", "--out-dir", str(out), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["summary"] == r1["summary"]


def test_bench_killed_with_sigkill_rerun_skips_what_finished(tmp_path: Path) -> None:
    """The real thing: the bench's whole process group gets SIGKILL once a problem finished."""
    import os
    import signal
    import sqlite3
    import time

    suite = tmp_path / "tiny.txt"
    suite.write_text("\n".join(TINY) + "\n")
    db = tmp_path / "k.db"
    args = [sys.executable, "-m", "kernellab.cli", "bench", str(suite), "--budget", "1", "--trials", "1", "--width", "1",
            "--debug-rounds", "0", "--device", "cpu", "--small", "--db", str(db), "--out-dir", str(tmp_path / "out")]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    done: list = []
    try:
        deadline = time.monotonic() + 300
        while not done and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            if db.exists():
                try:
                    with sqlite3.connect(db) as c:
                        done = c.execute("select id, name from campaigns where status = 'done'").fetchall()
                except sqlite3.OperationalError:  # the schema is being created
                    pass
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert done, "no problem finished before the deadline"
    with sqlite3.connect(db) as c:
        finished = [r[0] for r in c.execute("select id from campaigns where status = 'done'")]
        before = {cid: c.execute("select (select count(*) from candidates where campaign_id = ?), "
                                 "(select count(*) from evaluations where campaign_id = ?)", [cid, cid]).fetchone()
                  for cid in finished}
        n_camps = c.execute("select count(*) from campaigns").fetchone()[0]
    r = subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{len(finished)} skipped as finished" in r.stderr, r.stderr
    assert json.loads(r.stdout)["complete"]
    with sqlite3.connect(db) as c:
        for cid, counts in before.items():
            assert c.execute("select (select count(*) from candidates where campaign_id = ?), "
                             "(select count(*) from evaluations where campaign_id = ?)", [cid, cid]).fetchone() == counts
        # a campaign killed after it was created is resumed, not started again
        assert c.execute("select count(*) from campaigns").fetchone()[0] == max(n_camps, 2)


def test_a_stopped_bench_waits_only_for_the_campaigns_that_started(tmp_path):
    # queued campaigns' futures are cancelled by the stop, but concurrent.futures.wait() counts a cancelled future
    # done only once a pool thread reaches it: the stop waited its whole WAIT_S for campaigns that never started
    # and said "157 campaign thread(s) still busy" on the H200
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from kernellab.bench import _stop_bench
    from kernellab.store import Store

    started = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)
    futs = [pool.submit(lambda: (started.set(), time.sleep(0.3)))] + [pool.submit(time.sleep, 60) for _ in range(5)]
    started.wait(5)
    said: list[str] = []
    _stop_bench(None, pool, futs, Store(str(tmp_path / "k.db")), set(), threading.Lock(), lambda: {}, said.append)
    assert "(0 campaign thread(s) still busy" in said[-1], said
    assert all(f.cancelled() for f in futs[1:])


def test_a_few_large_problems_run_at_once_among_smaller_ones() -> None:
    from kernellab.bench import _Order

    large = {0, 1, 2}.__contains__  # the suite's first three problems are large
    order = _Order([(0, None), (1, "c1"), (2, None), (3, None), (4, None)], large, cap=1)
    first = order.take()
    assert first == (0, None, True)
    # one large problem runs: the next free thread takes the first smaller one, then the next
    assert order.take() == (3, None, False) and order.take() == (4, None, False)
    # only large ones left: they go in order, over the cap (a thread never waits for a problem)
    assert order.take() == (1, "c1", True)
    order.done(True)
    order.done(True)
    assert order.take() == (2, None, True)


def test_bench_asks_the_executor_which_problems_are_large(tmp_path: Path) -> None:
    from kernellab.sandbox import LocalExecutor

    gib = 1 << 30
    paths = ["experiments/problems/ops/gelu.py", "experiments/problems/ops/layernorm.py",
             "experiments/problems/ops/softmax.py"]  # in the suite's order
    suite = tmp_path / "three.txt"
    suite.write_text("\n".join(paths) + "\n")
    probs = [load_problem(ROOT / p) for p in paths]

    def executor() -> LocalExecutor:
        ex = LocalExecutor(cpu_workers=2, gpu_bytes=10 * gib)
        for p, est in zip(probs, (6 * gib, 6 * gib, gib // 4), strict=True):  # the meta device's estimate of a job
            ex._estimates[(p.id, True)] = (est, est // 4)
        return ex

    store = Store(tmp_path / "b.db")
    r, _, _ = run_bench(str(suite), store, TINY_KW, out_dir=tmp_path / "out", jobs=2, executor_factory=executor)
    assert r["complete"]
    started = [c["name"].split("-")[2] for c in sorted(store.list_campaigns(), key=lambda c: c["created_at"])]
    # gelu and layernorm are large (a job asks for 3/4 of the budget), softmax small: with two campaigns at
    # once, at most one large one (jobs // 4, at least 1) runs while a smaller one waits
    assert started == ["gelu", "softmax", "layernorm"], started


def test_campaigns_running_at_once_each_log_under_their_own_problem() -> None:
    import io
    import re
    import threading

    from rich.console import Console

    buf = io.StringIO()
    bench = Progress(enabled=True, plain=True, console=Console(file=buf))
    a, b = bench.fork(), bench.fork()
    a.update(problem="19_ReLU", problems_total=1)
    b.update(problem="21_Sigmoid", problems_total=1)
    a.update(last="tuning 54ba520fa7")
    b.update(last="1 evaluation(s) in 204 s")
    lines = buf.getvalue().splitlines()
    assert [ln.split("] ", 1)[1] for ln in lines[:2]] == ["problem 19_ReLU (1/1)", "problem 21_Sigmoid (1/1)"]
    assert lines[2].split("] ", 1)[1].startswith("19_ReLU: tuning 54ba520fa7; 0 evaluated")
    assert lines[3].split("] ", 1)[1].startswith("21_Sigmoid: 1 evaluation(s) in 204 s")
    # a resumed campaign that only re-times never names its problem: the bench names it for it
    bench.fork("1_Square").update(last="re-timing the winners in fresh jobs")
    assert buf.getvalue().splitlines()[4].split("] ", 1)[1].startswith("1_Square: re-timing the winners")
    a.update(problems_done=1)
    assert buf.getvalue().splitlines()[5].split("] ", 1)[1] == "19_ReLU: 1/1 problems done"
    # lines written from many threads at once come out whole, one a line
    buf.seek(0)
    buf.truncate()
    forks = [bench.fork() for _ in range(8)]
    threads = [threading.Thread(target=lambda f=f, k=k: [f.note(f"note {k} {n}") for n in range(200)])
               for k, f in enumerate(forks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1600 and all(re.fullmatch(r"kernellab \[\s*\d+ s\] note \d \d+", ln) for ln in lines)
    assert Progress(enabled=False).fork() is not None


def test_rerun_runs_a_finished_problem_once_more_and_the_rerun_counts(tmp_path: Path) -> None:
    suite = tmp_path / "tiny.txt"
    suite.write_text("\n".join(TINY) + "\n")
    store = Store(tmp_path / "a.db")
    out, lines = tmp_path / "out", []
    r0, _, mpath = run_bench(str(suite), store, TINY_KW, out_dir=out, log=lines.append)
    first = {c["name"].split("-")[2]: c["id"] for c in store.list_campaigns()}
    assert r0["complete"] and "rerun_of" not in json.dumps(r0["problems"])
    with pytest.raises(BenchError, match="--rerun nope: not a problem of"):
        run_bench(str(suite), store, TINY_KW, out_dir=out, rerun=["nope"])

    # interrupted after its first evaluation: the earlier finished campaign still counts meanwhile
    with pytest.raises(_Killed):
        run_bench(str(suite), store, TINY_KW, out_dir=out, progress=_Watch(kill_in="softmax"), rerun=["softmax"])
    again = [c for c in store.list_campaigns() if c["id"] not in first.values()]
    assert len(again) == 1 and again[0]["status"] == "stopped"
    assert again[0]["config"]["bench"]["rerun_of"] == first["softmax"]
    r1 = bench_summary(str(suite), [store], TINY_KW, out_dir=out)[0]
    assert {p["problem"]: p["campaign"] for p in r1["problems"]} == {p["problem"]: p["campaign"] for p in r0["problems"]}

    # the same command resumes the rerun (no third campaign), which then counts; once finished, it runs no more
    r2, _, mpath = run_bench(str(suite), store, TINY_KW, out_dir=out, log=lines.append, rerun=["softmax"])
    assert any("1 resumed" in m for m in lines), lines
    assert len(store.list_campaigns()) == 3 and store.get_campaign(again[0]["id"])["status"] == "done"
    rows = {p["problem"]: p for p in r2["problems"]}
    assert rows["softmax"]["rerun_of"] == first["softmax"] and rows["softmax"]["campaign"] == again[0]["name"]
    assert "rerun_of" not in rows["pointwise_chain"] and r2["summary"]["correct"] == 2
    assert "Run again under newer code (`--rerun`), the rerun counted: softmax." in mpath.read_text()
    before, watch = _counts(tmp_path / "a.db"), _Watch()
    run_bench(str(suite), store, TINY_KW, out_dir=out, progress=watch, rerun=["softmax"])
    assert watch.evaluated == 0 and _counts(tmp_path / "a.db") == before


def test_only_problems_with_work_are_run_before_the_bench_and_a_broken_one_stops_it(tmp_path: Path) -> None:
    # validating a file runs its reference (get_inputs and the model, at small sizes): the bench does it for the
    # problems it will run, not for the finished ones it scores from the database (170 of them took 15-25 s of
    # every suite call); a new file that does not run still stops the bench before any work
    marker = tmp_path / "drawn.txt"
    src = (ROOT / TINY[0]).read_text().replace(
        "def get_inputs():\n", f"def get_inputs():\n    open({str(marker)!r}, 'a').write('x')\n")
    assert src != (ROOT / TINY[0]).read_text()
    d = tmp_path / "suite"
    d.mkdir()
    (d / "softmax_marked.py").write_text(src)
    store = Store(tmp_path / "b.db")
    out = tmp_path / "out"
    first, _, _ = run_bench(str(d), store, TINY_KW, out_dir=out)
    assert first["complete"] and marker.read_text()  # validated, then run (in the parent: the checks' draws)
    marker.unlink()
    again, _, _ = run_bench(str(d), store, TINY_KW, out_dir=out)
    assert again["complete"] and not marker.exists()  # finished: scored, nothing of it ran
    (d / "broken.py").write_text(src.replace("return [torch.randn(rows, cols)]", "return [torch.randn(rows, cols, 'x')]"))
    campaigns = len(store.list_campaigns())
    with pytest.raises(ProblemError, match="broken.py"):
        run_bench(str(d), store, TINY_KW, out_dir=out)
    assert len(store.list_campaigns()) == campaigns
