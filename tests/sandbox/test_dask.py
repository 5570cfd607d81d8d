"""The Dask executor (``--cluster``): a bench on a two-worker cluster gives the local executor's statuses; a Dask
worker killed while it runs a job loses and duplicates no evaluation; the CLI's --cluster and worker; GPU cases.

The CPU cases run real Dask clusters (worker processes under nannies) and real sandbox workers in the Triton
interpreter, on a tiny suite (two bundled problems, budget 2)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from kernellab import load_problem  # noqa: E402
from kernellab.bench import run_bench  # noqa: E402
from kernellab.progress import Progress  # noqa: E402
from kernellab.sandbox import EvalJob, LocalExecutor, SandboxError  # noqa: E402
from kernellab.sandbox._dask import DaskExecutor, job_data, parse_cluster, run_job_data  # noqa: E402
from kernellab.store import Store  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ["experiments/problems/ops/softmax.py", "experiments/problems/fusions/pointwise_chain.py"]
KW = {"budget": 2, "trials": 1, "width": 2, "debug_rounds": 0, "device": "cpu", "small": True}


def _suite(tmp: Path) -> Path:
    suite = tmp / "tiny.txt"
    suite.write_text("\n".join(str(ROOT / p) for p in TINY) + "\n")
    return suite


def _statuses(db: Path) -> dict[str, list[tuple[str, str, str]]]:
    """problem -> sorted (candidate's action, evaluation kind, status) of every evaluation (a re-timing's
    candidate left out). The action, not the
    source's hash: two campaigns capturing their graphs at the same moment can name the placeholders differently
    (``x`` or ``arg2_1``), which changes the source but not the kernel nor its verdict."""
    with sqlite3.connect(db) as c:
        rows = c.execute("select p.name, k.action, e.kind, e.status from evaluations e "
                         "join candidates k on k.id = e.candidate_id join problems p on p.id = k.problem_id").fetchall()
    out: dict[str, list] = {}
    for name, h, kind, status in rows:
        # the winner's re-timing: which candidate wins is decided by interpreted timings (noise on the CPU)
        out.setdefault(name, []).append(("<the winner>" if kind == "retime" else h, kind, status))
    return {k: sorted(v) for k, v in out.items()}


def _duplicates(db: Path) -> list[tuple]:
    """(candidate, kind, config, n) recorded more than once: each must be written exactly once."""
    with sqlite3.connect(db) as c:
        return c.execute("select candidate_id, kind, config_json, count(*) from evaluations "
                         "group by candidate_id, kind, config_json having count(*) > 1").fetchall()


def _unevaluated(db: Path) -> list[str]:
    """Candidates without their judged (``full``) evaluation: lost ones."""
    with sqlite3.connect(db) as c:
        return [r[0] for r in c.execute("select id from candidates k where not exists (select 1 from evaluations e "
                                        "where e.candidate_id = k.id and e.kind = 'full')")]


@pytest.fixture(scope="module")
def local_bench(tmp_path_factory) -> tuple[Path, dict]:
    """The tiny bench with today's local executor: the statuses a cluster must reproduce."""
    tmp = tmp_path_factory.mktemp("local")
    db = tmp / "local.db"
    result, _, _ = run_bench(str(_suite(tmp)), Store(db), KW, out_dir=tmp / "out",
                             executor_factory=lambda: LocalExecutor(cpu_workers=2), jobs=2)
    return db, result


def _verdicts(result: dict) -> dict[str, tuple]:
    return {p["problem"]: (p["finished"], p["correct"], p["candidates"], p["evaluations"], p["failures"])
            for p in result["problems"]}


@pytest.mark.slow
def test_two_worker_cluster_bench_gives_the_local_executors_statuses(tmp_path: Path, local_bench) -> None:
    local_db, local_result = local_bench
    db = tmp_path / "dask.db"
    made: list[DaskExecutor] = []

    seen: list[str] = []

    class Shown(Progress):  # the real panel, silent, remembering what its cluster row said
        def update(self, **kw) -> None:
            if "cluster" in kw:
                seen.append(str(kw["cluster"]))
            super().update(**kw)

    progress = Shown(enabled=False)

    def factory() -> DaskExecutor:
        made.append(DaskExecutor("local:2", progress=progress))
        return made[0]

    result, _, _ = run_bench(str(_suite(tmp_path)), Store(db), KW, out_dir=tmp_path / "out", executor_factory=factory,
                             jobs=2, progress=progress)
    assert result["complete"] and result["summary"]["correct"] == local_result["summary"]["correct"] == 2
    assert _verdicts(result) == _verdicts(local_result)
    assert _statuses(db) == _statuses(local_db)
    assert not _duplicates(db) and not _unevaluated(db)
    # both workers took jobs, and the jobs ran in sandbox processes there, not in the Dask workers
    with sqlite3.connect(db) as c:
        details = [json.loads(d) for (d,) in c.execute("select details_json from evaluations")]
    assert len({d.get("dask_worker") for d in details}) == 2, [d.get("dask_worker") for d in details]
    assert all(d.get("job_id") for d in details)
    assert made[0]._closed  # the bench shut its executor (and the in-process cluster) down
    # the progress panel showed the workers, GPUs and jobs in flight, two at once at some point
    assert seen and all(x.startswith("2 workers (0 GPUs), ") for x in seen), seen
    flights = [int(x.split(", ")[1].split()[0]) for x in seen]
    assert max(flights) >= 2 and flights[-1] == 0, seen


def _run_killing_a_worker(tmp_path: Path, ex: DaskExecutor, kw: dict, db: Path) -> tuple[dict, dict]:
    """The tiny bench on ``ex`` (shut down after it), SIGKILLing the Dask worker process that runs the first job
    seen executing; the bench's result and what was killed (``at``: when, monotonic)."""
    killed: dict = {}

    def executing(dask_worker) -> list[str]:  # runs in each Dask worker (client.run)
        return [ts.key for ts in dask_worker.state.tasks.values()
                if ts.state == "executing" and str(ts.key).startswith("kernellab-eval-")]

    def killer() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            try:
                running = ex.client.run(executing)
                pids = ex.worker_pids()
            except Exception:
                return
            for addr, keys in running.items():
                if keys:
                    time.sleep(1.0)  # well inside the job (a job takes seconds)
                    try:  # still running it? (a small job on a GPU may be over by now)
                        keys = [k for k in ex.client.run(executing, workers=[addr])[addr] if k in keys]
                    except Exception:
                        return
                    if not keys:
                        break
                    os.kill(pids[addr], signal.SIGKILL)
                    killed.update(worker=addr, pid=pids[addr], keys=keys, at=time.monotonic())
                    return
            time.sleep(0.2)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        result, _, _ = run_bench(str(_suite(tmp_path)), Store(db), kw, out_dir=tmp_path / "out",
                                 executor_factory=lambda: ex, jobs=2)
    finally:
        t.join(timeout=5)
        ex.shutdown()
    assert killed, "no job was seen running to kill its worker"
    return result, killed


def _bench_killing_a_worker(tmp_path: Path, ex: DaskExecutor, kw: dict) -> tuple[dict, Path, dict]:
    """:func:`_run_killing_a_worker`, and what must hold after it when a worker takes the killed job again."""
    db = tmp_path / "killed.db"
    result, killed = _run_killing_a_worker(tmp_path, ex, kw, db)
    # the bench completed, every candidate has its judged evaluation, none is written twice (when not: the jobs
    # answered as infrastructure failures say why, e.g. no worker came back within worker_wait_s)
    with sqlite3.connect(db) as c:
        infra = [p for (p,) in c.execute("select payload_json from events where kind in ('infra', 'error')")]
    assert result["complete"], (infra, result["problems"])
    assert not _duplicates(db) and not _unevaluated(db)
    # the killed job itself was run again on another worker (or the restarted one) and recorded once
    job_ids = {k.removeprefix("kernellab-eval-") for k in killed["keys"]}
    with sqlite3.connect(db) as c:
        details = [json.loads(d) for (d,) in c.execute("select details_json from evaluations")]
    rerun = [d for d in details if d.get("job_id") in job_ids]
    assert len(rerun) == len(job_ids), (killed, [d.get("job_id") for d in details])
    assert all(d["dask_worker"] != killed["worker"] for d in rerun)
    return result, db, killed


@pytest.mark.slow
def test_a_worker_killed_mid_job_loses_and_duplicates_no_evaluation(tmp_path: Path, local_bench) -> None:
    local_db, local_result = local_bench
    result, db, _ = _bench_killing_a_worker(tmp_path, DaskExecutor("local:2"), KW)
    assert _verdicts(result) == _verdicts(local_result)
    assert _statuses(db) == _statuses(local_db)


@pytest.mark.slow
def test_the_only_worker_killed_mid_job_is_restarted_by_its_nanny_and_takes_the_job_again(tmp_path: Path,
                                                                                         local_bench) -> None:
    """The one-GPU host's case on the CPU: one worker (two slots) under its nanny; killed, it comes back (a new
    address, its resources and the kernellab plugin registered again) and the scheduler gives it the job."""
    local_db, local_result = local_bench
    result, db, _ = _bench_killing_a_worker(tmp_path, DaskExecutor("local:1", slots=2), KW)
    assert _verdicts(result) == _verdicts(local_result)


@pytest.mark.gpu
def test_gpu_worker_killed_mid_bench_loses_and_duplicates_no_evaluation(tmp_path: Path) -> None:
    """The same on the GPU host's cluster (one worker per GPU; with one GPU its worker is restarted by its nanny
    and takes the job again). Small sizes, one trial: the Dask mechanics do not need full-size problems."""
    # no tuning, no Inductor seed (on by default with CUDA; 205 s with them): the mechanics need neither
    kw = {**KW, "device": "cuda", "small": True, "trials": 1, "tune_trials": 0, "inductor_seed": False}
    result, _, _ = _bench_killing_a_worker(tmp_path, DaskExecutor("local", slots=2), kw)
    assert result["summary"]["correct"] >= 1


@pytest.fixture
def scheduler():
    """A Dask scheduler in this process with no worker (tests add their own); its address."""
    from distributed import Scheduler, SpecCluster

    cluster = SpecCluster(workers={}, scheduler={"cls": Scheduler, "options": {"dashboard": False,
                                                                               "host": "127.0.0.1"}})
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


def _worker_without_nanny(address: str, name: str) -> subprocess.Popen:
    """`kernellab worker`'s worker on the CPU, with no nanny: killed, nothing brings it back."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "DASK_LOGGING__DISTRIBUTED": "warning", "CUDA_VISIBLE_DEVICES": ""}
    code = ("from kernellab.sandbox._dask import start_worker; "
            f"start_worker({address!r}, slots=1, name={name!r}, nanny=False)")
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)


WAIT = 8.0  # the executor's worker_wait_s in the tests of a worker that never comes back


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_only_worker_killed_for_good_ends_the_bench_with_infra_results_and_a_resumed_bench_evaluates_them(
        tmp_path: Path, scheduler: str) -> None:
    """What hung: the cluster's only worker SIGKILLed mid-job and nothing restarting it. Its task sat in the
    scheduler's no-worker state and the bench waited on its future for ever; now, once the cluster has had no
    worker of the job's kind for ``worker_wait_s``, the job is answered as an infrastructure failure (a breaker:
    each campaign stops, saved, with no verdict on any candidate), the bench ends, and a bench resumed on a cluster
    with a worker again evaluates every candidate, each once."""
    db = tmp_path / "killed.db"
    procs = [_worker_without_nanny(scheduler, "lone")]
    try:
        ex = DaskExecutor(scheduler, worker_wait_s=WAIT)
        ex.client.wait_for_workers(1, timeout=120)
        result, killed = _run_killing_a_worker(tmp_path, ex, KW, db)
        took = time.monotonic() - killed["at"]
        # each of the two campaigns: its jobs out when the worker died answered after WAIT, or its next submit's
        # wait for a worker (WAIT), then it stops
        assert took < 2 * WAIT + 60, took
        assert not result["complete"] and result["summary"]["finished"] < 2, result["problems"]
        assert not _duplicates(db)
        with sqlite3.connect(db) as c:
            infra = [json.loads(p) for (p,) in c.execute("select payload_json from events where kind = 'infra'")]
            status = {s for (s,) in c.execute("select status from campaigns")}
        assert infra and {e["error_class"] for e in infra} == {"worker_start"}, infra
        assert any("no CPU worker" in e["error_text"] for e in infra), infra
        assert "done" not in status, status
        # no verdict on the candidates whose jobs were lost
        with sqlite3.connect(db) as c:
            judged = {cid for (cid,) in c.execute("select candidate_id from evaluations where kind = 'full'")}
        assert not {e["candidate_id"] for e in infra} & judged

        procs.append(_worker_without_nanny(scheduler, "second"))
        ex2 = DaskExecutor(scheduler, worker_wait_s=120)
        ex2.client.wait_for_workers(1, timeout=120)
        again, _, _ = run_bench(str(_suite(tmp_path)), Store(db), KW, out_dir=tmp_path / "out2",
                                executor_factory=lambda: ex2, jobs=2)
    finally:
        _stop(procs)
    assert again["complete"] and again["summary"]["correct"] == 2, again["problems"]
    assert not _duplicates(db) and not _unevaluated(db)
    with sqlite3.connect(db) as c:
        judged = {cid for (cid,) in c.execute("select candidate_id from evaluations where kind = 'full'")}
    assert {e["candidate_id"] for e in infra} <= judged


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_task_the_scheduler_gives_up_on_is_an_infra_result_not_a_verdict_nor_a_hang(tmp_path: Path) -> None:
    """``allowed-failures`` 0: the first death of a worker under a job makes the scheduler err its task with
    KilledWorker. The job is answered as the infrastructure result ``sandbox`` (no verdict on the candidate), the
    bench ends, and the candidate is evaluated once: by its campaign again, or by a resumed bench."""
    import dask

    db = tmp_path / "killed.db"
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):  # read by the in-process scheduler
        ex = DaskExecutor("local:1")
    result, killed = _run_killing_a_worker(tmp_path, ex, KW, db)
    with sqlite3.connect(db) as c:
        infra = [json.loads(p) for (p,) in c.execute("select payload_json from events where kind = 'infra'")]
    assert any(e["error_class"] == "sandbox" and "KilledWorker" in e["error_text"] for e in infra), infra
    assert not _duplicates(db)
    if not result["complete"]:  # the campaign stopped before evaluating it again: a resumed bench does
        result, _, _ = run_bench(str(_suite(tmp_path)), Store(db), KW, out_dir=tmp_path / "out2",
                                 executor_factory=lambda: DaskExecutor("local:1"), jobs=2)
    assert result["complete"] and result["summary"]["correct"] == 2, result["problems"]
    assert not _duplicates(db) and not _unevaluated(db)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_task_outside_the_jobs_waits_for_its_worker_within_the_bound_too(scheduler: str) -> None:
    """What ``profile`` waits on: a task's result while its worker lives, and SandboxError once the cluster has had
    no worker of its kind for ``worker_wait_s`` (before: ``.result()`` with no bound)."""
    from kernellab.sandbox._dask import CPU_SLOT

    procs = [_worker_without_nanny(scheduler, "lone")]
    ex = DaskExecutor(scheduler, worker_wait_s=3)
    try:
        ex.client.wait_for_workers(1, timeout=120)
        assert ex._wait(ex.client.submit(sum, [1, 2], resources={CPU_SLOT: 1}, pure=False), "cpu") == 3
        dfut = ex.client.submit(time.sleep, 600, resources={CPU_SLOT: 1}, pure=False)
        deadline = time.monotonic() + 60
        while dfut.key not in str(ex.client.processing()) and time.monotonic() < deadline:
            time.sleep(0.2)
        os.kill(procs[0].pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(SandboxError, match="no CPU worker for"):
            ex._wait(dfut, "cpu")
        assert time.monotonic() - t0 < 30
    finally:
        ex.shutdown()
        _stop(procs)


def test_a_job_for_a_kind_of_worker_the_cluster_lacks_is_answered_as_infra_within_the_bound(
        scheduler: str, problem) -> None:
    """No worker at all: the job is answered (a breaker, no verdict) after ``worker_wait_s``, not raised from
    ``submit`` nor left waiting; a bad device is still an error."""
    prob = problem("tiny_relu")
    src = prob.source.replace("class Model", "class ModelNew")
    ex = DaskExecutor(scheduler, worker_wait_s=2)
    try:
        t0 = time.monotonic()
        r = ex.submit(EvalJob(prob, src, device="cpu", trials=1, tag={"n": 1})).result(timeout=60)
        assert time.monotonic() - t0 < 30
        assert r["status"] == "crash" and r["error_class"] == "worker_start", r
        assert r["details"]["infra"] and r["details"]["breaker"] and r["details"]["tag"] == {"n": 1}
        assert "the Dask cluster has no CPU worker" in r["error_text"], r["error_text"]
        with pytest.raises(SandboxError, match="device must be"):
            ex.submit(EvalJob(prob, src, device="tpu"))
        with pytest.raises(SandboxError, match="worker_wait_s"):
            DaskExecutor(scheduler, worker_wait_s=0)
    finally:
        ex.shutdown()


@pytest.mark.slow
def test_kernellab_worker_joins_a_running_scheduler(tmp_path: Path, problem) -> None:
    """The multi-host path on one machine: `dask scheduler` on the loopback, `kernellab worker --scheduler`, and a
    coordinator that only knows the address."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "DASK_LOGGING__DISTRIBUTED": "warning"}
    sched_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                               "--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)]
    ex = None
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        procs.append(subprocess.Popen([sys.executable, "-m", "kernellab.cli", "worker", "--scheduler", address,
                                       "--slots", "2", "--name", "w0"], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True))
        ex = DaskExecutor(address)
        prob = problem("tiny_relu")
        src = prob.source.replace("class Model", "class ModelNew")
        futs = [ex.submit(EvalJob(prob, src + f"\n# {i}\n", trials=1)) for i in range(2)]  # waits for the worker
        rs = [f.result(timeout=300) for f in futs]
        assert [r["status"] for r in rs] == ["correct", "correct"], [r["error_text"] for r in rs]
        (info,) = ex.workers().values()
        assert info["name"] == "w0" and info["resources"] == {"kernellab-cpu-slot": 2} and info["nthreads"] == 2
        # its sandbox pool matches its slots
        assert list(ex.client.run(lambda dask_worker: dask_worker.kernellab_executor.cpu_workers).values()) == [2]
    finally:
        if ex is not None:
            ex.shutdown()
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGINT)
                p.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
    assert ex._cluster is None  # a remote cluster is left to its owner: the executor closed its client only


def test_jobs_and_results_travel_as_plain_data(tmp_path: Path) -> None:
    """What goes to a worker is JSON: no store, no Problem object, no callables."""
    prob = load_problem(ROOT / TINY[0])
    data = job_data(EvalJob(prob, "src", config={"BLOCK": 64}, device="cpu", small=True, store=Store(tmp_path / "a.db")),
                    "j1", {"k": {"compile_ms": 1.0}})
    assert json.loads(json.dumps(data)) == data
    assert data["problem"]["source"] == prob.source and data["baselines"] == {"k": {"compile_ms": 1.0}}


def test_run_job_data_returns_plain_data_and_the_baselines_measured(problem) -> None:
    """The worker side, with a real LocalExecutor: the result is JSON and carries the baselines it measured (none
    on the CPU) for the coordinator to write."""
    prob = problem("tiny_relu")
    src = prob.source.replace("class Model", "class ModelNew")
    ex = LocalExecutor(cpu_workers=1)
    try:
        r = run_job_data(job_data(EvalJob(prob, src, device="cpu", small=True, trials=1), "j2"), ex)
    finally:
        ex.shutdown()
    assert r["status"] == "correct" and r["details"]["job_id"] == "j2" and r["details"]["_baseline_puts"] == []
    assert json.loads(json.dumps(r)) == r


def test_cluster_addresses_are_checked_in_one_line() -> None:
    assert parse_cluster("local") == ("local", None) and parse_cluster("local:3") == ("local", 3)
    assert parse_cluster("tcp://10.0.0.1:8786") == ("tcp://10.0.0.1:8786", None)
    for bad in ("local:0", "local:x", "myhost:8786"):
        with pytest.raises(SandboxError):
            parse_cluster(bad)


@pytest.mark.slow
def test_cli_cluster_bad_input_exit_2_and_a_bench_on_a_local_cluster(tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "kernellab.cli", *a], capture_output=True, text=True,  # noqa: E731
                                    env=env, cwd=tmp_path, timeout=120)
    r = run("bench", str(_suite(tmp_path)), "--cluster", "nohost", "--budget", "1", "--db", str(tmp_path / "x.db"),
            "--out-dir", str(tmp_path / "bad"))
    assert r.returncode == 2 and "--cluster nohost" in r.stderr, r.stderr
    r = run("bench", str(_suite(tmp_path)), "--cluster", "tcp://127.0.0.1:9", "--budget", "1", "--db",
            str(tmp_path / "x.db"), "--out-dir", str(tmp_path / "bad"))
    assert r.returncode == 2 and "no Dask scheduler reachable" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "bad").exists()  # no result file for a bench that could not start
    r = run("worker", "--scheduler", "localhost")
    assert r.returncode == 2 and "tcp://HOST:8786" in r.stderr, r.stderr
    # nothing listens there: one line, no traceback (port 9 is discard, closed on a test machine)
    r = run("run", str(ROOT / TINY[0]), "--cluster", "tcp://127.0.0.1:9", "--budget", "1", "--db", str(tmp_path / "y.db"))
    assert r.returncode == 2 and "no Dask scheduler reachable" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "y.db").exists()  # nothing written
    # and the way that works: a bench on an in-process cluster of two CPU workers
    r = run("bench", str(_suite(tmp_path)), "--cluster", "local:2", "--budget", "1", "--trials", "1", "--width", "1",
            "--debug-rounds", "0", "--jobs", "2", "--db", str(tmp_path / "z.db"), "--out-dir", str(tmp_path / "out"),
            "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["complete"] and out["summary"]["correct"] == 2


@pytest.mark.slow
def test_resume_goes_on_on_a_cluster(tmp_path: Path) -> None:
    """A campaign started here (never run: as after a crash before its first evaluation) resumed with
    `--cluster local:1`: its evaluations run on the cluster's worker; an unreachable cluster is one line, exit 2."""
    from kernellab.campaign import CampaignConfig, check_campaign, start_campaign

    db = tmp_path / "k.db"
    config = CampaignConfig(problems=[str(ROOT / TINY[0])], device="cpu", budget=1, trials=1, width=1)
    start_campaign(Store(db), config, name="moved", problems=check_campaign(config))
    env = {**os.environ, "TRITON_INTERPRET": "1", "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "kernellab.cli", *a], capture_output=True, text=True,  # noqa: E731
                                    env=env, cwd=tmp_path, timeout=300)
    r = run("resume", "moved", "--db", str(db), "--cluster", "tcp://127.0.0.1:9")
    assert r.returncode == 2 and "no Dask scheduler reachable" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not Store(db).evaluations(campaign_id=Store(db).get_campaign("moved")["id"])
    r = run("resume", "moved", "--db", str(db), "--cluster", "local:1", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    store = Store(db)
    evals = store.evaluations(campaign_id=store.get_campaign("moved")["id"])
    assert evals and all((e.get("details") or {}).get("dask_worker") for e in evals), [e.get("details") for e in evals]


@pytest.mark.gpu
def test_gpu_cluster_one_worker_per_gpu_timing_exclusive_baseline_cached_remotely(tmp_path: Path, problem) -> None:
    """On a GPU host: `--cluster local` makes one worker per GPU, each owning it (4 jobs at once there); on each
    GPU no job's timing overlaps another job's timing or trials (its lock lives in the Dask worker owning it);
    the torch.compile baseline is measured once, on a worker, and written by the coordinator to the store, and
    the other worker gets it from the coordinator instead of measuring it again."""
    import torch

    p = problem("tiny_relu")  # small sizes, one trial: the mechanics, not the problem, are under test
    src = (Path(__file__).parent / "adversarial" / "correct_triton.py").read_text()
    store = Store(tmp_path / "g.db")
    ex = DaskExecutor("local", slots=4)
    try:
        st = ex.state()
        assert st["workers"] == st["gpus"] == torch.cuda.device_count()
        r1 = ex.submit(EvalJob(p, src, trials=1, small=True, store=store)).result(timeout=300)
        assert r1["status"] == "correct" and not r1["interpreted"] and r1["speedup_compile"], r1["error_text"]
        assert r1["details"].get("baseline_cached_by_coordinator")
        with sqlite3.connect(store.path) as c:
            assert c.execute("select count(*) from baselines where problem_id = ?", [p.id]).fetchone()[0] == 1
        futs = [ex.submit(EvalJob(p, src + f"\n# variant {i}\n", trials=1, small=True, store=store))
                for i in range(4 * st["gpus"])]
        rs = [f.result(timeout=300) for f in futs]
        assert all(r["status"] == "correct" and r["compile_ms"] == r1["compile_ms"] for r in rs), rs
        assert not any(r["details"].get("baseline_cached_by_coordinator") for r in rs)  # nobody measured it again
        by_worker: dict[str, list] = {}
        for r in rs:
            by_worker.setdefault(r["details"]["dask_worker"], []).append(r)
        assert len(by_worker) == st["gpus"]
        for same_gpu in by_worker.values():
            for i, r in enumerate(same_gpu):
                t0, t1 = r["details"]["timing_window"]
                for j, other in enumerate(same_gpu):
                    if j == i:
                        continue
                    o0, o1 = other["details"]["timing_window"]
                    assert o1 <= t0 or t1 <= o0, "two timings overlapped on one GPU"
                    for a, b in other["details"]["trial_windows"]:
                        assert b <= t0 or t1 <= a, f"job {j}'s trial {(a, b)} overlapped job {i}'s timing"
    finally:
        ex.shutdown()


def test_absence_clock_fires_once_the_limit_is_reached_and_starts_again():
    """The one clock behind the jobs' and a direct wait's bound on a missing worker kind."""
    from kernellab.sandbox._dask import _Absence

    patient = _Absence(3600.0)
    assert patient.over(True) is None and patient.since is not None  # missing: counting, far from the limit
    assert patient.over(False) is None and patient.since is None  # seen again: the clock is reset
    eager = _Absence(0.0)
    assert eager.over(True) == 0.0  # at the limit on the first look
    assert eager.since is None  # and counting again from the next look
