"""The GPU benchmarks' scripts run end to end on the CPU (interpreter, small sizes), so a GPU call is never the
first to find one broken: a crash there costs minutes of a session's 30."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from kb_reference_problems import DROPOUT, TARGETS

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}


def run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_bench_tuning_smoke_run_and_replay(tmp_path: Path) -> None:
    out = tmp_path / "tuning.md"
    p = run("experiments/bench_tuning.py", "--smoke", "--seeds", "2", "--template", "softmax", "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.with_suffix(".json").read_text())["softmax"]
    assert res["smoke"] and res["grid"]["configs"] == 8 and len(res["studies"]) == 2
    assert res["summary"]["budget"] == 2 and "interpreter smoke run" in out.read_text()
    # a recorded GPU grid, replayed: the studies' reach over seeds, without timing anything
    recorded = ROOT / "experiments" / "results" / "2026-12-01-nvidia-h200-tuning.json"
    p = run("experiments/bench_tuning.py", "--replay", str(recorded), "--seeds", "5", "--first-seed", "7")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "matmul: 2 of 108 configs within 3% of the best; seeds 7-11:" in p.stdout, p.stdout


def test_bench_optimize_writes_after_each_model_and_keeps_an_earlier_calls(tmp_path: Path) -> None:
    kb = tmp_path / "kb" / "level3"
    kb.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "optimize" / "small_model.py", kb / "small_model.py")
    common = ["experiments/bench_optimize.py", "--kernelbench", str(tmp_path / "kb"), "--budget", "3",
              "--time-budget", "120", "--max-heavy", "1", "--trials", "1", "--out-dir", str(tmp_path / "out"), "--no-inductor-seed"]
    p = run(*common, "--db", str(tmp_path / "a.db"), "--models", "small_model,no_such_model")
    (first,) = (tmp_path / "out").glob("*-optimize.json")
    res = json.loads(first.read_text())
    names = [m["name"] for m in res["models"]]
    assert names == ["small_model", "no_such_model"], p.stderr[-2000:]
    small, missing = res["models"]
    assert "error" not in small and small["check"]["ok"] and small["patched_share"] > 0
    assert small["covered_share"] is None  # interpreted: own-kernel shares are Python wall time
    assert "error" in missing and p.returncode == 1  # a model that failed is a row, and the run says so
    assert "kernellab [" in p.stderr  # the campaigns' progress lines
    assert res["inductor_seed"] is False and "no torch.compile seed" in first.with_suffix(".md").read_text()
    # the next call measures the missing one again and keeps the first call's row
    kept = tmp_path / "first.json"
    shutil.copy(first, kept)
    p = run(*common, "--db", str(tmp_path / "a.db"), "--models", "no_such_model", "--keep", str(kept))
    res = json.loads(first.read_text())
    assert [m["name"] for m in res["models"]] == ["small_model", "no_such_model"]
    assert res["models"][0] == small and res["summary"]["correct"] == 1


def test_bench_throughput_side_by_side_on_tiny_problems(tmp_path: Path) -> None:
    # a KernelBench-like folder of two tiny problems (SMALL sizes), named so that the suite's rule puts them in
    # two families; both sides are this tree's HEAD, so their verdicts must agree
    kb = tmp_path / "kb"
    (kb / "level1").mkdir(parents=True)
    (kb / "level2").mkdir()
    shutil.copy(ROOT / "experiments" / "problems" / "ops" / "softmax.py", kb / "level1" / "23_Softmax.py")
    shutil.copy(ROOT / "experiments" / "problems" / "fusions" / "gemm_bias_gelu.py", kb / "level2" / "76_Gemm_Add_ReLU.py")
    out = tmp_path / "out"
    p = run("experiments/bench_throughput.py", "--kernelbench", str(kb), "--base", "HEAD", "--small", "--budget", "2",
            "--jobs", "2", "--base-jobs", "1", "--bench-args", "--trials 2 --width 2", "--side-limit-s", "400",
            "--out", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    (page,) = out.glob("*-throughput.json")
    res = json.loads(page.read_text())
    assert [r["family"] for r in res["suite"]] == ["gemm_epilogue", "reduction_norm"]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert res["order"] == ["base", "new"] and res["sides"]["base"]["commit"] == head and res["interpreted"]
    assert res["jobs_by_side"] == {"base": 1, "new": 2}  # --base-jobs runs the base at its own --jobs
    for side in res["sides"].values():
        assert side["problems_finished"] == 2 and side["stopped"] is None and side["wall_s"] > 0
        assert side["problems_per_hour"] > 0 and side["evaluations"] >= 2
        assert side["evaluations_per_gpu_hour"] is None and side["gpu_busy_share"] is None  # no GPU, no NVML
        # phases are summed to 0.1 s: a one-job side's candidate loads can round to 0.0
        assert "load" in side["phase_s"] and sum(side["phase_s"].values()) > 0 and "admission_wait_s" in side
    assert res["comparison"]["problems_per_hour_ratio"] > 0
    rows = {r["problem"]: r for r in res["comparison"]["rows"]}
    assert set(rows) == {"23_Softmax", "76_Gemm_Add_ReLU"} and all(r["agree"] for r in rows.values())
    assert all(r["new"]["correct"] and r["new"]["origin"] for r in rows.values())
    md = page.with_suffix(".md").read_text()
    assert "Problems per hour, new / base" in md and "| load |" in md and "--jobs base 1, new 2" in md
    import gzip
    import sqlite3

    for label in ("base", "new"):
        raw = gzip.decompress((out / f"{page.stem}-{label}.db.gz").read_bytes())
        (tmp_path / f"{label}.db").write_bytes(raw)
        with sqlite3.connect(tmp_path / f"{label}.db") as c:
            assert c.execute("select count(*) from campaigns where status = 'done'").fetchone()[0] == 2
    worktrees = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert "kernellab-throughput-" not in worktrees  # the base's checkout is gone
    for side in res["sides"].values():  # the host was watched, and never came near the default floor here
        assert 0 < side["host_floor_gb"] < side["host_least_available_gb"] <= side["host_total_gb"]
    assert "Host memory, the least available while each side ran (GB): base " in md


def _hw():
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import host_watch
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    return host_watch


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's reaper may be slow, or absent in a container)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


# as the sandbox starts its workers: a new session, out of the parent's process group; the parent ignores
# SIGINT where asked (a command that does not stop when told) or exits 3 on it (one that stops cleanly)
_TREE = ("import signal, subprocess, sys, time; w = subprocess.Popen(['sleep', '120'], start_new_session=True); "
         "signal.signal(signal.SIGINT, {handler}); print(w.pid, flush=True); time.sleep(120)")


@contextlib.contextmanager
def _tree(handler: str = "signal.SIG_IGN"):
    p = subprocess.Popen([sys.executable, "-c", _TREE.format(handler=handler)], stdout=subprocess.PIPE, text=True)
    worker = int(p.stdout.readline())
    try:
        yield p, worker
    finally:
        p.kill()
        p.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, 9)


def _available() -> int:
    from kernellab.sandbox._reference import host_memory

    return host_memory()[0]


def test_kill_tree_reaches_a_worker_that_started_its_own_session() -> None:
    hw = _hw()
    with _tree() as (p, worker):
        assert set(hw.process_tree(p.pid)) == {p.pid, worker}
        assert set(hw.kill_tree(p.pid)) == {p.pid, worker}
        assert p.wait(timeout=10) == -9 and _wait_gone(worker)


def test_host_watch_asks_first_kills_after_its_grace_and_leaves_a_host_above_its_floor_alone() -> None:
    hw = _hw()
    with _tree() as (p, worker):
        calm = hw.HostWatch(p.pid, floor=0, every=0.05)  # 0: never
        calm.start()
        time.sleep(0.3)
        calm.halt.set()
        calm.join(timeout=5)
        assert calm.fired is None and 0 < calm.least <= calm.total and p.poll() is None and _running(worker)
        # under the floor, not under half of it: SIGINT (ignored here), then SIGKILL to the tree after the grace
        watch = hw.HostWatch(p.pid, floor=int(_available() * 1.5), every=0.05, grace_s=0.5)
        watch.start()
        watch.join(timeout=10)
        assert watch.killed and watch.fired.startswith("host memory: ") and " s after SIGINT)" in watch.fired
        assert p.wait(timeout=10) == -9 and _wait_gone(worker)


def test_host_watch_lets_a_command_that_stops_when_asked_stop_itself() -> None:
    hw = _hw()
    with _tree("lambda *a: sys.exit(3)") as (p, _):
        watch = hw.HostWatch(p.pid, floor=int(_available() * 1.5), every=0.05, grace_s=30)
        watch.start()
        assert p.wait(timeout=10) == 3
        watch.join(timeout=5)
        assert not watch.is_alive() and watch.fired and not watch.killed  # the watch saw it end and stopped


def test_host_watch_command_line() -> None:
    ok = run("experiments/host_watch.py", "--floor-gb", "0", "--", sys.executable, "-c", "import sys; sys.exit(5)")
    assert ok.returncode == 5 and ok.stderr == ""
    code = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"
    t0 = time.monotonic()
    cut = run("experiments/host_watch.py", "--floor-gb", "1e9", "--", sys.executable, "-c", code)
    # an exabyte's floor: under half of it at once, so no grace; 128 + SIGKILL
    assert cut.returncode == 137 and time.monotonic() - t0 < 30
    assert cut.stderr.startswith("host_watch: host memory: ") and "killed with its processes" in cut.stderr
    # a stop given to the watch reaches its command, whose status it returns
    code = ("import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: sys.exit(3)); print('ready', flush=True); "
            "time.sleep(60)")
    w = subprocess.Popen([sys.executable, "experiments/host_watch.py", "--floor-gb", "0", "--", sys.executable, "-c", code],
                         cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    assert w.stdout.readline() == "ready\n"
    w.send_signal(signal.SIGINT)
    assert w.wait(timeout=30) == 3
    none = run("experiments/host_watch.py", "--floor-gb", "1")
    assert none.returncode == 2 and none.stderr.strip() == "host_watch: error: no command (host_watch.py [options] -- CMD [ARG...])"


def test_bench_throughput_stops_a_side_under_the_host_floor_and_still_writes_its_page(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    (kb / "level1").mkdir(parents=True)
    (kb / "level2").mkdir()
    shutil.copy(ROOT / "experiments" / "problems" / "ops" / "softmax.py", kb / "level1" / "23_Softmax.py")
    out = tmp_path / "out"
    bad = run("experiments/bench_throughput.py", "--kernelbench", str(kb), "--host-floor-gb", "-1", "--out", str(out))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "bench_throughput: error: --host-floor-gb -1: at least 0 (0: never stop a side for memory)"]
    p = run("experiments/bench_throughput.py", "--kernelbench", str(kb), "--sides", "new", "--small", "--budget", "1",
            "--host-floor-gb", "1e9", "--side-limit-s", "300", "--out", str(out))
    assert p.returncode == 0, p.stderr[-3000:]  # a side stopped for memory is a result, not a bench failure
    (page,) = out.glob("*-throughput.json")
    side = json.loads(page.read_text())["sides"]["new"]
    assert side["stopped"].startswith("host memory: ") and side["problems_finished"] == 0 and not side["failed"]
    assert side["host_floor_gb"] == 1e9 and side["wall_s"] < 60
    assert "| host memory: " in page.with_suffix(".md").read_text()


def test_bench_throughput_pages_memory_admission_by_problem(tmp_path: Path) -> None:
    # session 17's suite waited 646.8 s in admission, most of it two conv problems admitted at 2.5x their jobs'
    # peaks after one out-of-memory: the page now names such problems (need against peak, retries)
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import bench_throughput as bt
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    from kernellab.problem import load_problem
    from kernellab.store import Store

    db = tmp_path / "b.db"
    gb = 10**9
    with Store(db) as store:
        cid = store.create_campaign("c", {"budget": 2}, "cuda", {})
        for name, waits, need, peak, retried in (("conv", [30.0, 12.5], 65.4, 26.2, True), ("gemm", [0.0], 3.3, 1.5, False)):
            problem = load_problem(ROOT / "tests" / "problems" / "kb_gemm_add_relu.py")
            pid = store.add_problem(type(problem)(name=name, source=problem.source + f"\n# {name}\n", path=problem.path))
            cand = store.add_candidate(cid, pid, f"import torch  # {name}\n", origin="seed", action="seed")
            for i, wait in enumerate(waits):
                details = {"memory": {"admission_wait_s": wait, "need_bytes": int(need * gb), "peak_bytes": int(peak * gb)}}
                if retried and i == 0:
                    # the attempt that ran out: its segments (reserved) over its grant, its allocated peak under
                    details["retries"] = [{"error_class": "oom", "grant_bytes": int(need / 2 * gb),
                                           "peak_reserved_bytes": int(33.0 * gb)}]
                if retried and i == 1:  # it kept 6 GB of reference outputs on the device: its own side is the rest
                    details["memory"].update(peak_reserved_bytes=int(28.0 * gb), refs_on_device_bytes=int(6.0 * gb))
                store.add_evaluation(cand, {"status": "correct", "config": {"i": i}, "details": details}, kind="trial")
    rows = {r["problem"]: r for r in bt.read_db(db)["memory"]}
    assert rows["conv"] == {"problem": "conv", "evaluations": 2, "admission_wait_s": 42.5, "need_gb": 65.4,
                            "peak_gb": 26.2, "reserved_gb": 33.0, "side_gb": 22.0, "oom_retries": 1}
    assert rows["gemm"]["admission_wait_s"] == 0.0 and rows["gemm"]["oom_retries"] == 0
    side = {"commit": "x", "problems_finished": 0, "problems": 2, "wall_s": 1.0, "problems_per_hour": 0.0,
            "evaluations": 3, "evaluations_per_gpu_hour": None, "gpu_busy_share": None, "gpu_util_mean": None,
            "stopped": None, "phase_s": {}, "admission_wait_s": 42.5, "memory": list(rows.values()), "verdicts": {}}
    res = {"order": ["new"], "date": "d", "command": "c", "device": "gpu", "versions": {}, "commit": "x", "suite": [],
           "max_ref_gb": 16.0, "problems": [], "budget": 4, "jobs": 8, "side_limit_s": 320.0, "small": False,
           "interpreted": False, "sides": {"new": side}, "comparison": bt.compare({"new": side})}
    md = bt.markdown(res)
    assert "| new | conv | 2 | 42.5 | 65.4 | 26.2 | 33.0 | 1 |" in md and "| new | gemm |" not in md  # no wait, no row


def test_kb_public_call_keeps_its_database_when_the_host_watch_stops_the_bench(tmp_path: Path) -> None:
    # the device call's script end to end on the CPU: a bench stopped for host memory still leaves the call its
    # log line and database to return, and a call with room finishes its problem and pages it
    suite = tmp_path / "kb"
    suite.mkdir()
    shutil.copy(ROOT / "experiments" / "problems" / "ops" / "softmax.py", suite / "23_Softmax.py")
    # this tree as it is, on PYTHONPATH: nothing installed (a .whl folder made for the GPU host holds its Python's
    # wheels), and an empty site folder, so no earlier install shadows the tree
    (tmp_path / "site").mkdir()
    env = {**ENV, "PYTHON": sys.executable, "KB_SUITE": str(suite / "*.py"), "KB_TIMEOUT": "300", "KERNELLAB_COMMIT": "test",
           "KERNELLAB_SKIP_INSTALL": "1", "KERNELLAB_SITE": str(tmp_path / "site")}

    def call(out: Path, **more: str) -> str:
        p = subprocess.run(["bash", "scripts/kb_public.sh"], cwd=ROOT, env={**env, "OUT": str(out), **more},
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return p.stdout

    cut = call(tmp_path / "cut", KB_HOST_FLOOR_GB="1e9")
    assert "kb_public: bench rc 137 " in cut and "host_watch: host memory: " in (tmp_path / "cut" / "kb-bench.log").read_text()
    assert (tmp_path / "cut" / "kb-public.db.gz").stat().st_size > 0
    full = call(tmp_path / "call" / "kb")
    assert "kb_public: bench rc 0 " in full
    (page,) = (tmp_path / "call" / "kb").glob("*-kb-public.json")
    (row,) = json.loads(page.read_text())["problems"]
    assert row["problem"] == "23_Softmax" and row["correct"]

    # what the call brought back, kept under the progress page's names (as the device tool leaves it: read-only)
    for f in (tmp_path / "call" / "kb").iterdir():
        f.chmod(0o444)
    results = tmp_path / "results"
    saved = run("experiments/kb_save_call.py", str(tmp_path / "call"), "s99-call1", "--results", str(results))
    assert saved.returncode == 0, saved.stderr
    stem = f"{page.name[:10]}-cpu-x86-64-triton-interp-kb-public-s99-call1"
    for suffix in (".json", ".md", ".log"):
        assert (results / (stem + suffix)).stat().st_mode & 0o777 == 0o644
    assert (results / "kb-public-level12-budget4.db.gz").read_bytes() == (tmp_path / "call" / "kb" / "kb-public.db.gz").read_bytes()
    assert "| test | 1 (1/1) | ? (bench " in saved.stdout and f"`{stem}.md` |" in saved.stdout
    # a database of another device's results is not replaced by this one, and nothing is written
    import gzip

    from kernellab.store import Store

    with Store(tmp_path / "h200.db") as store:
        store.create_campaign("bench-x", {"budget": 4}, "NVIDIA H200", {})
    (results / "kb-public-level12-budget4.db.gz").write_bytes(gzip.compress((tmp_path / "h200.db").read_bytes()))
    before = sorted(p.name for p in results.iterdir())
    refused = run("experiments/kb_save_call.py", str(tmp_path / "call"), "s99-call2", "--results", str(results))
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.strip().splitlines()) == 1
    assert "one database holds one device's timings" in refused.stderr and "NVIDIA H200" in refused.stderr
    assert sorted(p.name for p in results.iterdir()) == before


def test_reference_control_fails_a_reference_that_draws_random_numbers(tmp_path: Path) -> None:
    # KernelBench's order draws dropout twice (reference, then candidate, no reseed): the reference fails itself
    drop, plain = tmp_path / "drop.py", tmp_path / "plain.py"
    drop.write_text(DROPOUT.replace("{p}", "0.5"))
    plain.write_text(DROPOUT.replace("{p}", "0.0"))
    p = run("experiments/kb_reference_control.py", str(drop), timeout=300)
    assert p.returncode == 1, p.stderr[-2000:]
    assert p.stdout.count("KernelBench's order: FAIL") == 2 and p.stdout.count("reseeded alike: equal") == 2, p.stdout
    p = run("experiments/kb_reference_control.py", str(plain), timeout=300)
    assert p.returncode == 0 and p.stdout.count("KernelBench's order: pass") == 2, p.stdout + p.stderr[-2000:]
    # KernelBench casts every input to the precision, class indices included: the reference raises
    targets = tmp_path / "targets.py"
    targets.write_text(TARGETS)
    p = run("experiments/kb_reference_control.py", str(targets), timeout=300)
    assert p.returncode == 1 and p.stdout.count("the reference raises in KernelBench's order") == 2, p.stdout
    p = run("experiments/kb_reference_control.py", str(tmp_path / "none.py"))
    assert p.returncode == 2 and "no such file" in p.stderr
    # KernelBench's own eval: a checkout and a CUDA device, else one line and exit 2
    p = run("experiments/kb_reference_control.py", str(drop), "--harness", str(tmp_path))
    assert p.returncode == 2 and "not a KernelBench checkout" in p.stderr, p.stderr
    (tmp_path / "kb" / "src" / "kernelbench").mkdir(parents=True)
    (tmp_path / "kb" / "src" / "kernelbench" / "eval.py").write_text("")
    p = run("experiments/kb_reference_control.py", str(drop), "--harness", str(tmp_path / "kb"))
    assert p.returncode == 2 and "needs a CUDA device" in p.stderr, p.stderr
