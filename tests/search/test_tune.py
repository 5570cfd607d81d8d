"""Optuna tuning through the real sandbox (Triton interpreter on CPU), and SPACE parsing."""

from __future__ import annotations

import optuna
import pytest
from search_synth import Synth

from kernellab.search import SpaceError, Tree, parse_space, read_space, tune
from kernellab.search._tune import space_size, study_name
from kernellab.store import Store

PROBLEM = '''import torch
size = 4096
SMALL = {"size": 127}
class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0
def get_inputs():
    return [torch.randn(size)]
def get_init_inputs():
    return []
'''

# BLOCK=48 does not compile (tl.arange needs a power of 2); EPS=0.5 runs but is wrong: both must FAIL.
CANDIDATE = '''import torch
import triton
import triton.language as tl

CONFIG = {"BLOCK": 64, "EPS": 0.0}
SPACE = {"BLOCK": [32, 48, 64], "EPS": [0.0, 0.5]}


@triton.jit
def affine_kernel(x_ptr, y_ptr, n, EPS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * 2.0 + 1.0 + EPS, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        affine_kernel[(triton.cdiv(n, CONFIG["BLOCK"]),)](x, y, n, EPS=CONFIG["EPS"], BLOCK=CONFIG["BLOCK"])
        return y
'''


@pytest.mark.parametrize("space,config,message", [
    ({}, None, "non-empty dict"),
    ({"B": []}, None, "empty list"),
    ({"B": [16, 16]}, None, "repeated"),
    ({"B": [{"x": 1}]}, None, "choices are None"),
    ({"B": (64, 16)}, None, "low <= high"),
    ({"B": (0, 16, "log")}, None, "low > 0"),
    ({"B": (1, 16, "lin")}, None, "only be \"log\""),
    ({"B": "16"}, None, "expected a list"),
    ({"B": [16, 32]}, {"B": 48}, r"CONFIG\['B'\] = 48 lies outside"),
    ({"B": (16, 64)}, {"B": 128}, "lies outside"),
])
def test_bad_spaces_have_clear_errors(space, config, message) -> None:
    with pytest.raises(SpaceError, match=message):
        parse_space(space, config)


def test_space_kinds_and_size() -> None:
    d = parse_space({"B": [16, 32], "W": (1, 8), "S": (16, 256, "log"), "F": (0.5, 1.0)}, {"B": 32, "W": 4})
    assert d["B"].choices == (16, 32) and (d["W"].low, d["W"].high, d["W"].log) == (1, 8, False)
    assert d["S"].log and type(d["F"]).__name__ == "FloatDistribution"
    assert space_size(parse_space({"B": [16, 32], "W": (1, 8)})) == 16
    assert space_size(d) is None


def test_read_space_keeps_ranges_without_running_the_source() -> None:
    src = "import os\nos.exit(1)\nCONFIG = {'B': 64}\nSPACE = {'B': [32, 64], 'W': (1, 8)}\n"
    assert read_space(src) == ({"B": [32, 64], "W": (1, 8)}, {"B": 64})
    assert read_space("x = 1\n") == (None, None)
    with pytest.raises(SpaceError, match="literal dict"):
        read_space("N = 4\nSPACE = {'B': list(range(N))}\n")


@pytest.fixture(scope="module")
def executor():
    from kernellab.sandbox import LocalExecutor

    ex = LocalExecutor(cpu_workers=1)  # one worker: the trial order is then fixed by the seed
    yield ex
    ex.shutdown()


@pytest.mark.parametrize("where", ["memory", "file"])
def test_tune_on_the_interpreter(tmp_path, executor, where) -> None:
    from kernellab import Problem

    store = Store(":memory:" if where == "memory" else tmp_path / "k.db")
    t = Synth(store)
    problem = Problem(name="affine", source=PROBLEM, path="affine.py")
    pid = store.add_problem(problem)
    cid = store.add_candidate(t.cid, pid, CANDIDATE, origin="seed", space={"BLOCK": [32, 48, 64], "EPS": [0.0, 0.5]})
    out = tune(problem, store.get_candidate(cid), store=store, executor=executor, n_trials=10, seed=0,
               device="cpu", trials=2)
    # the space has 6 configs: each evaluated once, however often TPE proposes it
    assert out["evaluated"] == 6 and out["complete"] >= 2 and out["seed"] == 0
    trials = store.evaluations(candidate_id=cid, kind="trial")
    assert len(trials) == 6
    by_cfg = {(e["config"]["BLOCK"], e["config"]["EPS"]): e for e in trials}
    assert by_cfg[(48, 0.0)]["status"] in ("compile_error", "runtime_error")
    assert by_cfg[(64, 0.5)]["status"] == "incorrect" and by_cfg[(64, 0.0)]["status"] == "correct"

    storage = f"sqlite:///{tmp_path / 'k.db'}" if where == "file" else None
    study = (optuna.load_study(study_name=study_name(cid), storage=storage) if storage
             else optuna.load_study(study_name=study_name(cid), storage=__import__(
                 "kernellab.search._tune", fromlist=["x"]).optuna_storage(store)))
    first = study.trials[0]
    assert first.params == {"BLOCK": 64, "EPS": 0.0} and first.state.name == "COMPLETE"  # the enqueued CONFIG
    failed = [tr for tr in study.trials if tr.state.name == "FAIL" and "duplicate_of" not in tr.user_attrs]
    assert len(failed) == 4
    assert all(tr.user_attrs["reason"] and tr.user_attrs["status"] != "correct" for tr in failed)
    assert any(tr.user_attrs["status"] == "incorrect" for tr in failed)
    assert study.user_attrs["seed"] == 0 and study.user_attrs["candidate_id"] == cid

    # the two correct configs are re-timed with full timing; the faster is the best, and the tree sees it
    retimes = store.evaluations(candidate_id=cid, kind="retime")
    assert sorted(r["config"]["BLOCK"] for r in retimes) == [32, 64]
    assert all(r["status"] == "correct" and r["interpreted"] for r in retimes)
    assert out["best_config"] in [r["config"] for r in retimes] and out["best_config"]["EPS"] == 0.0
    assert out["best_ms"] == min(r["median_ms"] for r in retimes)
    assert study.user_attrs["best_config"] == out["best_config"]
    node = Tree(store, t.cid, pid)[cid]
    assert node.surrogate and node.best["kind"] == "retime"

    # tuning again resumes the study: nothing is evaluated twice, the re-timings included
    again = tune(problem, store.get_candidate(cid), store=store, executor=executor, n_trials=10, seed=0,
                 device="cpu", trials=2)
    assert again["evaluated"] == 0 and len(store.evaluations(candidate_id=cid, kind="trial")) == 6
    assert len(store.evaluations(candidate_id=cid, kind="retime")) == 2
    assert again["best_config"] == out["best_config"] and again["best_ms"] == out["best_ms"]
    store.close()
    if where == "file":  # the store still opens a file that holds Optuna's tables
        Store(tmp_path / "k.db").close()
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        assert names == [study_name(cid)]


def test_a_tuning_stopped_in_its_retiming_keeps_what_was_retimed(tmp_path) -> None:
    """The stop (a bench's time limit, a signal) during the top configurations' re-timing: the ones that ended
    are saved and named on the study, and the resumed tuning re-times only the rest. On the H200 a stopped
    34_InstanceNorm tuning ran its three 77-96 GB re-timing jobs again in the next call (about 4 minutes)."""
    from kernellab import Problem, _interrupt
    from kernellab.sandbox import LocalExecutor

    class StopAfterFirstRetime:
        """The real store; the stop given once the first re-timing is saved (what the signal would do then)."""

        def __init__(self, store, guard) -> None:
            self.store, self.guard = store, guard

        def add_evaluation(self, candidate_id, result, kind="full"):
            eid = self.store.add_evaluation(candidate_id, result, kind=kind)
            if kind == "retime":
                self.guard.stop()
            return eid

        def __getattr__(self, name):
            return getattr(self.store, name)

    store = Store(tmp_path / "k.db")
    t = Synth(store)
    problem = Problem(name="affine", source=PROBLEM, path="affine.py")
    pid = store.add_problem(problem)
    cid = store.add_candidate(t.cid, pid, CANDIDATE, origin="seed", space={"BLOCK": [32, 48, 64], "EPS": [0.0, 0.5]})
    guard = _interrupt.Guarded(LocalExecutor(cpu_workers=1))
    with pytest.raises(_interrupt.Stopped):
        tune(problem, store.get_candidate(cid), store=StopAfterFirstRetime(store, guard), executor=guard, n_trials=6,
             seed=0, device="cpu", trials=2)
    first = store.evaluations(candidate_id=cid, kind="retime")
    assert len(first) == 1 and first[0]["status"] == "correct"
    with LocalExecutor(cpu_workers=1) as ex:
        out = tune(problem, store.get_candidate(cid), store=store, executor=ex, n_trials=6, seed=0, device="cpu",
                   trials=2)
    retimes = store.evaluations(candidate_id=cid, kind="retime")
    assert sorted(r["config"]["BLOCK"] for r in retimes) == [32, 64] and retimes[0]["id"] == first[0]["id"]
    assert out["evaluated"] == 0 and len(out["retimed"]) == 2 and out["best_config"] is not None
    store.close()


def test_no_trial_starts_after_the_deadline(executor) -> None:
    """The campaign's time budget reaches into tuning: past the deadline nothing more is evaluated (a
    30 s --time-budget ran for minutes in a tuning on the H200)."""
    import time

    from kernellab import Problem

    store = Store(":memory:")
    t = Synth(store)
    problem = Problem(name="affine", source=PROBLEM, path="affine.py")
    pid = store.add_problem(problem)
    cid = store.add_candidate(t.cid, pid, CANDIDATE, origin="seed", space={"BLOCK": [32, 48, 64], "EPS": [0.0, 0.5]})
    out = tune(problem, store.get_candidate(cid), store=store, executor=executor, n_trials=10, seed=0,
               device="cpu", trials=2, deadline=time.monotonic() - 1.0)
    assert out["evaluated"] == 0 and out["best_config"] is None and out["retimed"] == []
    assert store.evaluations(candidate_id=cid, kind="trial") == []
    assert store.evaluations(candidate_id=cid, kind="retime") == []


def test_tune_without_space(store) -> None:
    t = Synth(store)
    with pytest.raises(SpaceError, match="no SPACE"):
        tune(None, store.get_candidate(t.add("r", speedup=1.0)), store=store, executor=object(), n_trials=3)


def test_reopened_study_fails_stale_running_trials_and_goes_on(tmp_path, executor) -> None:
    """A tuning killed mid-trial leaves that trial RUNNING in the study; reopening marks it FAIL
    (stale) and evaluates its configuration again instead of counting it as an outcome."""
    from optuna.trial import TrialState

    from kernellab import Problem
    from kernellab.search._tune import STALE, flatten_space, optuna_storage

    store = Store(tmp_path / "k.db")
    t = Synth(store)
    problem = Problem(name="affine", source=PROBLEM, path="affine.py")
    pid = store.add_problem(problem)
    cid = store.add_candidate(t.cid, pid, CANDIDATE, origin="seed", space={"BLOCK": [32, 48, 64], "EPS": [0.0, 0.5]})
    space, config = read_space(CANDIDATE)
    dists = parse_space(*flatten_space(space, config))
    # what a killed tuning leaves: the study, its enqueued CONFIG asked and never told
    study = optuna.create_study(study_name=study_name(cid), storage=optuna_storage(store), direction="minimize")
    study.enqueue_trial(config)
    killed = study.ask(dists)
    assert killed.params == config and study.trials[0].state == TrialState.RUNNING

    out = tune(problem, store.get_candidate(cid), store=store, executor=executor, n_trials=2, seed=0,
               device="cpu", trials=2, retime_top=1)
    study = optuna.load_study(study_name=study_name(cid), storage=optuna_storage(store))
    first = study.trials[0]
    assert first.state == TrialState.FAIL and STALE in first.user_attrs
    assert not [tr for tr in study.trials if tr.state == TrialState.RUNNING]
    # the killed trial's configuration is evaluated again, and tuning went on past it
    again = [tr for tr in study.trials[1:] if tr.params == config]
    assert again and again[0].state == TrialState.COMPLETE
    assert out["evaluated"] == 2 and out["complete"] >= 1 and out["best_config"] is not None
    assert {(e["config"]["BLOCK"], e["config"]["EPS"]) for e in store.evaluations(candidate_id=cid, kind="trial")} \
        >= {(64, 0.0)}
    store.close()


@pytest.mark.parametrize("objective", ["speedup_eager", "speedup_compile"])
def test_tuning_best_is_the_row_the_store_selects(objective) -> None:
    """Re-timings whose lowest median is not their highest speedup (each times eager in its own job):
    the tuning names the configuration ``best_evaluation`` selects, as on the H200 (BLOCK 512 had the
    lowest median, BLOCK 1024 the higher speedup); interpreted rows, without speedups, go by the median."""
    from kernellab.search._tune import best_retime
    from kernellab.vocab import best_evaluation

    def row(block: int, ms: float, speedup: float | None, status: str = "correct") -> dict:
        return {"candidate_id": "c", "kind": "retime", "status": status, "config": {"BLOCK": block},
                "median_ms": ms, "speedup_eager": speedup, "speedup_compile": speedup}

    rows = [row(512, 0.0100, 1.20), row(1024, 0.0102, 1.25), row(256, 0.0090, 1.40, status="mismatch")]
    assert best_retime(rows, objective)["config"] == {"BLOCK": 1024}
    assert best_evaluation(rows, objective)["config"] == best_retime(rows, objective)["config"]
    interpreted = [row(512, 2.0, None), row(1024, 1.5, None)]
    assert best_retime(interpreted, objective)["config"] == {"BLOCK": 1024}
    assert best_retime([row(64, 1.0, 1.0, status="error")], objective) is None
    with pytest.raises(ValueError, match="objective"):
        tune(None, {"id": "c", "source": CANDIDATE}, store=None, objective="fastest")


def test_optuna_storage_is_made_once_per_database_file(tmp_path):
    # making it imports Optuna, SQLAlchemy and Alembic and checks the schema: 3-4 s before a solo campaign's first
    # trial on the H200, and again for each later tuning; a campaign now makes it while its first evaluation runs
    from kernellab.search import prewarm_storage
    from kernellab.search._tune import optuna_storage

    store = Store(tmp_path / "k.db")
    prewarm_storage(store).join(120)
    made = optuna_storage(store)
    assert optuna_storage(store) is made
    other = Store(tmp_path / "other.db")
    assert optuna_storage(other) is not made and optuna_storage(other) is optuna_storage(other)
    store.close()
    other.close()
