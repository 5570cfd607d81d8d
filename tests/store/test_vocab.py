"""The store against the vocabulary (kernellab/vocab.py): what it writes is the vocabulary's, and its
SQL selection is the vocabulary's best evaluation."""

from __future__ import annotations

import random

import pytest

from kernellab import Problem
from kernellab.store import Store, StoreError
from kernellab.vocab import (
    FAILED,
    JUDGED,
    KINDS,
    OBJECTIVES,
    STATUSES,
    WINNER_RETIME,
    ConfigError,
    Kind,
    SpaceError,
    Status,
    apply_config,
    best_evaluation,
    best_key,
    counts_as_kernel_win,
    flatten_space,
    read_space,
    space_from_source,
    unflatten,
)

SRC = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n" \
      "def get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return []\n"


def _candidate(store, n_problems: int = 1) -> tuple[str, list[str], list[str]]:
    cid = store.create_campaign("c", {"objective": "speedup_eager"}, "test", {})
    pids = [store.add_problem(Problem(name=f"p{i}", source=SRC + f"# {i}\n", path=f"p{i}.py"))
            for i in range(n_problems)]
    cands = [store.add_candidate(cid, pid, f"source {pid} {j}") for pid in pids for j in range(4)]
    return cid, pids, cands


def test_every_status_and_kind_the_store_writes_is_a_vocabulary_member(store) -> None:
    _, _, cands = _candidate(store)
    assert set(STATUSES) == {s.value for s in Status} and set(FAILED) == set(STATUSES) - {"correct"}
    written = set()
    for status in Status:
        for kind in Kind:
            eid = store.add_evaluation(cands[0], {"status": status, "config": {"s": status.value}}, kind=kind)
            row = store.get_evaluation(eid)
            assert type(row["status"]) is str and type(row["kind"]) is str  # the value, never the enum's repr
            written.add((Status(row["status"]), Kind(row["kind"])))
    assert len(written) == len(STATUSES) * len(KINDS)
    with pytest.raises(StoreError, match="status 'ok' is not one of"):
        store.add_evaluation(cands[0], {"status": "ok"})
    with pytest.raises(StoreError, match="kind 'judged' is not one of"):  # accepted before the vocabulary
        store.add_evaluation(cands[0], {"status": "correct"}, kind="judged")
    # what the store reads back by kind: every row kernellab filters by a vocabulary member
    assert len(store.evaluations(candidate_id=cands[0], kind=Kind.TRIAL)) == len(STATUSES)
    assert {e["kind"] for e in store.evaluations(candidate_id=cands[0])} == set(KINDS)


def _random_rows(store, rng: random.Random, cands: list[str]) -> None:
    """Rows that exercise every part of the order: ties on the speedup and on the time, interpreted rows
    (no speedup), library-only rows, trials and profiles (never judged), winners' re-timings that passed
    (not selectable) and failed (their (candidate, config) out)."""
    for n in range(60):
        cand = rng.choice(cands)
        config = {"B": rng.choice([1, 2, 3])}
        kind = rng.choice([Kind.FULL, Kind.FULL, Kind.RETIME, Kind.RETIME, Kind.TRIAL, Kind.PROFILE])
        status = rng.choice([Status.CORRECT] * 4 + [Status.INCORRECT, Status.TIMEOUT])
        interpreted = rng.random() < 0.25
        ms = rng.choice([None, 1.0, 2.0, 2.0, 3.0]) if status == Status.CORRECT else None
        result = {"status": status, "config": config, "median_ms": ms, "interpreted": interpreted,
                  "library_only": rng.random() < 0.2, "details": {},
                  "own_kernel_share": rng.choice([None, 0.0, 0.3, 0.5, 0.9]),
                  "speedup_eager": None if interpreted or ms is None else rng.choice([None, 1.5, 2.0, 2.0, 4.0]),
                  "speedup_compile": None if interpreted or ms is None else rng.choice([0.5, 1.0, 1.0]),
                  "id": f"e{n:03d}"}
        if kind == Kind.RETIME and rng.random() < 0.3:  # a winner's re-timing, passed or failed
            result["details"] = {WINNER_RETIME: {"selected": "x"}}
            if status != Status.CORRECT and rng.random() < 0.5:  # out of memory: the candidate's, or ours
                result["error_class"] = rng.choice(["oom", "infra:oom"])
                result["details"]["memory"] = {"refs_on_device_bytes": rng.choice([0, 7 * 10**9])}
        store.add_evaluation(cand, result, kind=kind)


@pytest.mark.parametrize("seed", range(6))
def test_store_best_is_the_vocabulary_best(store, seed: int) -> None:
    cid, pids, cands = _candidate(store, n_problems=2)
    _random_rows(store, random.Random(seed), cands)
    rows = store.evaluations(campaign_id=cid)
    by_problem = {pid: [e for e in rows if store.get_candidate(e["candidate_id"])["problem_id"] == pid]
                  for pid in pids}
    checked = 0
    for objective in OBJECTIVES:
        for library, kernel in ((True, False), (False, False), (True, True), (False, True)):
            got = {r["problem_id"]: r["id"] for r in store.best(cid, objective=objective, library=library, kernel=kernel)}
            want = {pid: b["id"] for pid, evs in by_problem.items()
                    if (b := best_evaluation(evs, objective, library, kernel)) is not None}
            assert got == want, (objective, library, kernel)
            # a benchmark's winner is a kernel win (vocab's rule on each row), and the SQL's filter is that rule
            assert all(counts_as_kernel_win(store.get_evaluation(i)) for i in got.values()) or not kernel
            checked += len(want)
    assert checked >= 4  # the seeded rows do select something


def test_best_key_orders_real_speedups_then_interpreted_times() -> None:
    rows = [{"id": "interp-fast", "speedup_eager": None, "median_ms": 0.1},
            {"id": "slow-2x", "speedup_eager": 2.0, "median_ms": 5.0},
            {"id": "fast-2x", "speedup_eager": 2.0, "median_ms": 4.0},
            {"id": "untimed", "speedup_eager": None, "median_ms": None},
            {"id": "3x", "speedup_eager": 3.0, "median_ms": 9.0}]
    assert [r["id"] for r in sorted(rows, key=best_key("speedup_eager"))] == \
        ["3x", "fast-2x", "slow-2x", "interp-fast", "untimed"]
    with pytest.raises(ValueError, match="not one of speedup_eager, speedup_compile"):
        best_key("speedup")
    assert JUDGED == ("full", "retime")


def test_apply_config_merges_per_kernel_entries() -> None:
    cfg = {"g1": {"BLOCK": 128, "num_warps": 4}, "g2": {"BLOCK": 64}, "FLAG": True}
    apply_config(cfg, {"g1": {"BLOCK": 256}, "FLAG": False})
    # the kernel keeps the parameters the config does not name (a flat update lost num_warps)
    assert cfg == {"g1": {"BLOCK": 256, "num_warps": 4}, "g2": {"BLOCK": 64}, "FLAG": False}
    assert apply_config({"A": 1}, {"B": 2}, space={"B": [2, 3]}) == {"A": 1, "B": 2}
    with pytest.raises(ConfigError, match=r"config keys \['C'\] are in neither CONFIG nor SPACE"):
        apply_config({"A": 1}, {"C": 2})
    with pytest.raises(ConfigError, match="has no CONFIG dict"):
        apply_config(None, {"A": 1})
    assert apply_config(None, {}) is None  # no config: nothing to apply, nothing required


def test_space_reading_flattening_and_the_stored_form() -> None:
    src = "SPACE = {'g': {'BLOCK': [64, 128], 'W': (1, 8)}, 'S': [0, 1]}\nCONFIG = {'g': {'BLOCK': 64, 'W': 4}, 'S': 0}\n"
    space, config = read_space(src)
    assert space["g"]["W"] == (1, 8)  # a range stays a tuple for the tuner
    flat_space, flat_config = flatten_space(space, config)
    assert flat_space == {"g.BLOCK": [64, 128], "g.W": (1, 8), "S": [0, 1]}
    assert unflatten({**flat_config, "g.BLOCK": 128}, True) == {"g": {"BLOCK": 128, "W": 4}, "S": 0}
    assert space_from_source(src) == {"g": {"BLOCK": [64, 128], "W": [1, 8]}, "S": [0, 1]}  # as JSON stores it
    assert space_from_source("SPACE = make()\n") is None and space_from_source("def (") is None
    # a CONFIG that is not a literal does not hide a literal SPACE from the store
    assert space_from_source("SPACE = {'A': [1]}\nCONFIG = dict(A=1)\n") == {"A": [1]}
    with pytest.raises(SpaceError, match=r"CONFIG \(line 2\) must be a literal dict"):
        read_space("SPACE = {'A': [1]}\nCONFIG = dict(A=1)\n")


def test_strategy_studies_and_optuna_studies_share_one_file(tmp_path):
    """Optuna keeps a table named ``studies`` in the campaign's own file; kernellab's table of strategy
    studies must not take that name (it did, and every tuning in a campaign failed to create its study)."""
    import optuna

    from kernellab.search._tune import optuna_storage

    store = Store(tmp_path / "k.db")
    store.put_study("s1", "starter", {"cells": []})
    study = optuna.create_study(study_name="kernellab-x", storage=optuna_storage(store))
    study.optimize(lambda t: t.suggest_int("a", 0, 3), n_trials=2)
    assert store.get_study("s1")["suite"] == "starter"
    assert len(optuna.load_study(study_name="kernellab-x", storage=optuna_storage(store)).trials) == 2
