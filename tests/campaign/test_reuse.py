"""Cross-campaign result reuse, end to end on the CPU: a second campaign on the same problem records the
first one's evaluation of the builtin seed instead of running a sandbox job, and does not when its
trials, the device or the software versions differ, or when reuse is off."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernellab.campaign import CampaignConfig, run_campaign, start_campaign
from kernellab.sandbox import LocalExecutor
from kernellab.store import Store

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "tests" / "sandbox" / "problems" / "tiny_relu.py"
TINY = dict(budget=1, width=1, debug_rounds=0)


class CountingExecutor(LocalExecutor):
    """The real local executor; counts the evaluate step's jobs (not the winners' re-timings, nor the
    reference-and-baseline job a GPU campaign starts with)."""

    def __init__(self) -> None:
        super().__init__(cpu_workers=1)
        self.evaluations = 0

    def submit(self, job):
        if not job.retime and not job.prepare:
            self.evaluations += 1
        return super().submit(job)


@pytest.fixture
def ex():
    with CountingExecutor() as e:
        yield e


def _campaign(store: Store, ex: CountingExecutor, name: str, **options) -> tuple[dict, int]:
    """Run a one-candidate campaign; (the seed's `full` evaluation, the sandbox jobs it took)."""
    cid = start_campaign(store, CampaignConfig(problems=[str(PROBLEM)], **{**TINY, "trials": 1, **options}), name=name)
    before = ex.evaluations
    run_campaign(store, cid, executor=ex)
    (seed,) = store.candidates(cid)
    (full,) = store.evaluations(candidate_id=seed["id"], kind="full")
    return full, ex.evaluations - before


def test_second_campaign_reuses_the_seed_evaluation(tmp_path: Path, ex: CountingExecutor) -> None:
    store = Store(tmp_path / "k.db")
    first, jobs = _campaign(store, ex, "first")
    assert jobs == 1 and first["status"] == "correct" and "reused_from" not in first["details"]
    assert first["details"]["settings"] == {"trials": 1, "small": True, "mode": "train"}

    second, jobs = _campaign(store, ex, "second")
    assert jobs == 0, "the seed was evaluated again"
    assert second["details"]["reused_from"] == first["id"]
    assert second["id"] != first["id"] and second["campaign_id"] != first["campaign_id"]
    for k in ("status", "median_ms", "eager_ms", "max_abs_err", "device", "interpreted", "versions", "config"):
        assert second[k] == first[k], k
    assert second["details"]["gpu_s"] == 0.0  # no device time spent by this campaign
    # the campaign's own tables are complete: its summary has a winner, and it was re-timed in a fresh job
    summary = store.summary(second["campaign_id"])
    assert summary["best"] and summary["best"][0]["retimed"]

    # a third campaign reuses the original, not the copy
    third, jobs = _campaign(store, ex, "third")
    assert jobs == 0 and third["details"]["reused_from"] == first["id"]

    # other correctness trials, or reuse off: evaluated in the sandbox
    other, jobs = _campaign(store, ex, "trials2", trials=2)
    assert jobs == 1 and "reused_from" not in other["details"]
    off, jobs = _campaign(store, ex, "off", reuse=False)
    assert jobs == 1 and "reused_from" not in off["details"]


@pytest.mark.gpu
def test_gpu_campaign_reuses_a_gpu_evaluation(tmp_path: Path, ex: CountingExecutor) -> None:
    """On the GPU the worker's device name and versions must match the campaign process's: a second
    campaign reuses the first's timed (not interpreted) evaluation."""
    store = Store(tmp_path / "k.db")
    first, jobs = _campaign(store, ex, "first", device="cuda", tune_trials=0, inductor_seed=False)
    assert jobs == 1 and first["status"] == "correct" and not first["interpreted"]
    second, jobs = _campaign(store, ex, "second", device="cuda", tune_trials=0, inductor_seed=False)
    assert jobs == 0 and second["details"]["reused_from"] == first["id"]
    assert second["speedup_eager"] == first["speedup_eager"] is not None


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[dict, dict]:
    """(the seed's candidate row, its evaluation) from a campaign run in a database of its own."""
    store = Store(tmp_path_factory.mktemp("measured") / "a.db")
    with CountingExecutor() as e:
        full, _ = _campaign(store, e, "elsewhere")
    return store.get_candidate(full["candidate_id"]), full


@pytest.mark.parametrize("change", [
    {},  # the control: the same row as measured is reused
    {"versions": {"torch": "0.0.1"}},
    {"versions": {"triton": "0.0"}},
    {"device": "NVIDIA H200"},
    {"details": {"settings": {"trials": 1, "small": False, "mode": "train"}}},
    {"status": "timeout"},
])
def test_reuse_needs_the_same_device_versions_and_settings(tmp_path: Path, ex: CountingExecutor,
                                                           measured: tuple[dict, dict], change: dict) -> None:
    """An evaluation of the seed recorded by another campaign (as a database from another machine or
    another kernellab would hold it) is reused only when its device, versions and settings match."""
    cand, full = measured
    store = Store(tmp_path / "k.db")
    other = store.create_campaign("other", {}, full["device"], full["versions"])
    store.add_problem(_problem())
    oid = store.add_candidate(other, cand["problem_id"], cand["source"], origin=cand["origin"])
    row = {k: full[k] for k in ("status", "median_ms", "p20_ms", "p80_ms", "eager_ms", "max_abs_err", "device",
                                "interpreted", "config", "versions", "details")}
    for k, v in change.items():
        row[k] = {**row[k], **v} if isinstance(v, dict) else v
    eid = store.add_evaluation(oid, row)
    second, jobs = _campaign(store, ex, "second")
    if change:
        assert jobs == 1 and "reused_from" not in second["details"]
    else:
        assert jobs == 0 and second["details"]["reused_from"] == eid


def _problem():
    from kernellab.problem import load_problem

    return load_problem(PROBLEM)


def test_cli_reuses_by_default_and_not_with_no_reuse(tmp_path: Path, ex: CountingExecutor) -> None:
    from click.testing import CliRunner

    from kernellab.cli import main

    db = tmp_path / "k.db"
    first, _ = _campaign(Store(db), ex, "first")
    for name, flags, reused in (("on", [], True), ("off", ["--no-reuse"], False)):
        res = CliRunner().invoke(main, ["run", str(PROBLEM), "--campaign", name, "--db", str(db), "--budget", "1",
                                        "--width", "1", "--trials", "1", "--debug-rounds", "0", "--json", *flags])
        assert res.exit_code == 0, res.output
        store = Store(db)
        camp = store.get_campaign(name)
        (full,) = store.evaluations(campaign_id=camp["id"], kind="full")
        assert camp["config"]["reuse"] is reused
        assert full["details"].get("reused_from") == (first["id"] if reused else None)


def test_the_code_step_submits_each_candidate_as_it_writes_it(tmp_path: Path) -> None:
    # the evaluate step begins after the whole code step, which waits for the Inductor seed's compile: the builtin
    # seed's evaluation waited 10.4 s for it in a solo run on the H200. Now the code step submits it, and the
    # evaluate step collects that job (one job, not two)
    import traceback

    class Where(CountingExecutor):
        def __init__(self) -> None:
            super().__init__()
            self.callers: list[str] = []

        def submit(self, job):
            if not job.retime:
                self.callers.append(next((f.name for f in reversed(traceback.extract_stack())
                                          if f.name in ("start_evaluation", "evaluate_many", "evaluate")), "?"))
            return super().submit(job)

    store = Store(tmp_path / "k.db")
    with Where() as ex:
        full, jobs = _campaign(store, ex, "early", reuse=False)
    assert jobs == 1 and ex.callers == ["start_evaluation"], ex.callers
    assert full["status"] == "correct"
