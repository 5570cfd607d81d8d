"""One conformance suite for every store backend (in-memory and file), per the BaseStore contract."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path

import pytest

from kernellab import Problem
from kernellab.store import Store, StoreError

SRC = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n" \
      "def get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return []\n"


def _problem() -> Problem:
    return Problem(name="p", source=SRC, path="p.py")


def _result(status="correct", ms=1.0, **kw):
    return {"status": status, "median_ms": ms, "p20_ms": ms * 0.9, "p80_ms": ms * 1.1, "eager_ms": 2.0,
            "speedup_eager": 2.0 / ms if status == "correct" else None, "device": "test", **kw}


def _campaign(store) -> str:
    return store.create_campaign("c1", {"budget": 3}, "test", {"torch": "x"})


def test_campaign_roundtrip(store) -> None:
    cid = _campaign(store)
    c = store.get_campaign("c1")
    assert c["id"] == cid and c["config"] == {"budget": 3} and c["status"] == "running"
    assert store.get_campaign(cid[:6])["name"] == "c1"
    store.update_campaign(cid, status="done")
    assert store.get_campaign(cid)["status"] == "done"
    with pytest.raises(StoreError, match="exists already"):
        store.create_campaign("c1", {}, "test", {})
    c["config"]["budget"] = 99  # snapshot: changing it changes nothing stored
    assert store.get_campaign(cid)["config"] == {"budget": 3}


def test_content_hash_ids_are_idempotent(store) -> None:
    cid = _campaign(store)
    pid = store.add_problem(_problem())
    assert store.add_problem(_problem()) == pid
    a = store.add_candidate(cid, pid, "source A", action="seed", origin="seed")
    assert store.add_candidate(cid, pid, "source A", action="again") == a
    assert len(store.candidates(cid)) == 1
    other = store.create_campaign("c2", {}, "test", {})
    b = store.add_candidate(other, pid, "source A", origin="seed")
    assert b != a and store.get_candidate(b)["source_hash"] == store.get_candidate(a)["source_hash"]


def test_tree_queries(store) -> None:
    cid = _campaign(store)
    pid = store.add_problem(_problem())
    root = store.add_candidate(cid, pid, "root", origin="seed")
    kid = store.add_candidate(cid, pid, "kid", parent_id=root, action="fuse")
    grand = store.add_candidate(cid, pid, "grand", parent_id=kid, action="tile 128")
    side = store.add_candidate(cid, pid, "side", parent_id=root, action="split-K")
    assert [c["id"] for c in store.lineage(grand)] == [root, kid, grand]
    assert store.get_candidate(grand)["depth"] == 2
    assert [c["id"] for c in store.subtree(root)] == [root, kid, side, grand]
    assert [c["id"] for c in store.subtree(kid)] == [kid, grand]
    with pytest.raises(StoreError):
        store.add_candidate(cid, pid, "orphan", parent_id="nope")
    with pytest.raises(StoreError):
        store.lineage("nope")


def test_evaluations_atomic_immutable_and_best(store) -> None:
    cid = _campaign(store)
    pid = store.add_problem(_problem())
    a = store.add_candidate(cid, pid, "a", origin="seed")
    b = store.add_candidate(cid, pid, "b", parent_id=a)
    c = store.add_candidate(cid, pid, "c", parent_id=a)
    ea = store.add_evaluation(a, _result(ms=1.0), metrics=[("k1", "dram_pct", 80.0), ("k1", "sm_pct", 20.0)])
    store.add_evaluation(b, _result(ms=0.5))
    store.add_evaluation(c, _result(status="incorrect", ms=0.1, error_text="mismatch"))
    assert store.add_evaluation(a, _result(ms=3.0)) == ea  # same (candidate, config, kind): recorded once
    assert len(store.evaluations(candidate_id=a)) == 1
    assert {m["name"] for m in store.metrics(ea)} == {"dram_pct", "sm_pct"}
    best = store.best(cid)
    assert len(best) == 1 and best[0]["candidate_id"] == b and best[0]["speedup_eager"] == 4.0
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        store._conn.execute("update evaluations set status = 'correct' where id = ?", [ea])
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        store._conn.execute("delete from evaluations where id = ?", [ea])
    # a metric that cannot be written rolls the whole evaluation back
    store._conn.execute("CREATE TEMP TRIGGER refuse_metric BEFORE INSERT ON metrics WHEN NEW.name = 'boom' "
                        "BEGIN SELECT RAISE(ABORT, 'metric refused'); END")
    with pytest.raises(sqlite3.IntegrityError, match="metric refused"):
        store.add_evaluation(b, _result(ms=0.4, config={"B": 1}), metrics=[("k", "ok", 1.0), ("k", "boom", 2.0)])
    assert len(store.evaluations(candidate_id=b)) == 1
    assert store.get_evaluation(store.evaluation_id(b, {"B": 1}, "full")) is None
    with pytest.raises(StoreError):
        store.add_evaluation(b, {"status": "great"})
    s = store.summary(cid)
    assert s["candidates"] == 3 and s["statuses"] == {"correct": 2, "incorrect": 1}
    assert s["best"][0]["candidate_id"] == b


def test_events_llm_calls_baselines(store) -> None:
    cid = _campaign(store)
    e1 = store.add_event(cid, "plan", {"idea": "fuse"})
    store.add_event(cid, "stop", {"why": "budget"})
    assert [e["kind"] for e in store.events(cid)] == ["plan", "stop"] and e1 > 0
    assert store.events(cid, "plan")[0]["payload"] == {"idea": "fuse"}
    store.add_llm_call({"campaign_id": cid, "role": "coder", "model": "m", "input_tokens": 10,
                        "output_tokens": 5, "cost_usd": 0.01, "request_hash": "h",
                        "request_json": {"a": 1}, "response_json": {"b": 2}})
    assert store.llm_calls(cid)[0]["request"] == {"a": 1}
    assert store.summary(cid)["llm"]["cost_usd"] == pytest.approx(0.01)
    store.put_baseline("k", {"problem_id": "p", "device": "d", "compile_ms": 1.5, "versions_json": {"t": 1}})
    assert store.get_baseline("k")["compile_ms"] == 1.5


def _writer(path: str, worker: int, n: int) -> None:
    s = Store(path)
    camp = s.get_campaign("shared")["id"]
    pid = s.get_problem("p")["id"]
    for i in range(n):
        cand = s.add_candidate(camp, pid, f"w{worker}-{i}")
        s.add_evaluation(cand, _result(ms=1.0 + i), metrics=[("k", "m", float(i))])
        s.add_event(camp, "eval", {"w": worker, "i": i})
    s.close()


def test_two_processes_writing_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    s = Store(path)
    s.create_campaign("shared", {}, "test", {})
    s.add_problem(_problem())
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 60)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    camp = s.get_campaign("shared")["id"]
    assert len(s.candidates(camp)) == 120
    assert len(s.evaluations(campaign_id=camp)) == 120
    assert len(s.events(camp)) == 120
    assert sum(len(s.metrics(e["id"])) for e in s.evaluations(campaign_id=camp)) == 120


def test_refuses_foreign_and_newer_files(tmp_path: Path) -> None:
    text = tmp_path / "notes.db"
    text.write_text("hello, not a database")
    with pytest.raises(StoreError, match="not a SQLite database"):
        Store(text)
    assert text.read_text() == "hello, not a database"

    foreign = tmp_path / "other.db"
    conn = sqlite3.connect(foreign)
    conn.execute("create table t (x)")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    with pytest.raises(StoreError, match="not a kernellab one"):
        Store(foreign)
    assert foreign.read_bytes() == before

    newer = tmp_path / "newer.db"
    Store(newer).close()
    conn = sqlite3.connect(newer)
    conn.execute("insert into _sqlite_migrations (migration_set, name, applied_at) values ('kernellab', '9999_future', 'x')")
    conn.commit()
    conn.close()
    before = newer.read_bytes()
    with pytest.raises(StoreError, match="newer kernellab"):
        Store(newer)
    assert newer.read_bytes() == before


def test_reopen_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    s = Store(path)
    cid = _campaign(s)
    s.close()
    s2 = Store(path)
    assert s2.get_campaign(cid)["name"] == "c1"
    assert s2._conn.execute("pragma journal_mode").fetchone()[0] == "wal"
