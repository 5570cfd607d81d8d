from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from kernellab.vocab import (
    DEFAULT_OBJECTIVE,
    JUDGED,
    KERNEL_WIN_SHARE,
    KINDS,
    OBJECTIVES,
    OOM_CLASSES,
    STATUSES,
    WINNER_RETIME,
    Kind,
    Status,
    canonical_json,
)

from ._base import BaseStore, StoreError, now
from ._schema import KNOWN, MIGRATION_SET, migrations

_SQLITE_MAGIC = b"SQLite format 3\x00"


def _hash(*parts: str) -> str:
    from kernellab.problem import content_hash

    return content_hash(*parts)


def _decode(row: dict | None) -> dict | None:
    if row is None:
        return None
    out = dict(row)
    for k, v in list(out.items()):
        if k.endswith("_json"):
            out[k[:-5]] = json.loads(v) if v else None
    return out


def _check_file(path: Path) -> None:
    """Refuse, without writing, a file that is not a kernellab database."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb") as f:
        if f.read(16) != _SQLITE_MAGIC:
            raise StoreError(f"{path}: not a SQLite database (refusing to touch it)")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        if not tables:
            return
        if "_sqlite_migrations" not in tables:
            raise StoreError(f"{path}: a SQLite database, but not a kernellab one (refusing to touch it)")
        applied = [r[0] for r in conn.execute(
            "select name from _sqlite_migrations where migration_set = ? order by rowid", [MIGRATION_SET])]
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: cannot read it as a database: {exc}") from None
    finally:
        conn.close()
    if not applied:
        raise StoreError(f"{path}: a SQLite database, but not a kernellab one (refusing to touch it)")
    unknown = [n for n in applied if n not in KNOWN]
    if unknown:
        raise StoreError(
            f"{path}: written by a newer kernellab (unknown schema migrations {', '.join(unknown)}); "
            "upgrade kernellab to open it")


class SQLiteStore(BaseStore):
    """The store on one SQLite file (``path``) or in memory (``":memory:"``)."""

    def __init__(self, path: str | os.PathLike = "kernellab.db", *, timeout_s: float = 60.0):
        self.path = str(path)
        self.memory = self.path == ":memory:"
        if not self.memory:
            _check_file(Path(self.path))
        # One connection shared by threads under a lock; isolation_level=None so that we issue
        # BEGIN IMMEDIATE ourselves: a writer takes the write lock up front instead of failing to
        # upgrade a read lock when another process writes (SQLITE_BUSY without retry).
        self._conn = sqlite3.connect(self.path, timeout=timeout_s, check_same_thread=False,
                                     isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        self._conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        if not self.memory:
            self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        self.db = Database(self._conn, execute_plugins=False)
        with self._lock:
            # BEGIN IMMEDIATE so that two processes creating one file do not both migrate
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                pending = migrations.pending(self.db)
                if pending:
                    migrations.ensure_migrations_table(self.db)
                    for m in pending:
                        m.fn(self.db)
                        migrations._record_applied(self.db, m.name)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    # -- plumbing ------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _one(self, sql: str, params: Sequence[Any] = ()) -> dict | None:
        with self._lock:
            row = self._conn.execute(sql, params).fetchone()
        return _decode(dict(row)) if row else None

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[dict]:
        with self._lock:
            rows = self._conn.execute(sql, params).fetchall()
        return [_decode(dict(r)) for r in rows]

    @staticmethod
    def _insert(conn: sqlite3.Connection, table: str, row: dict, ignore: bool = True) -> int:
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        verb = "INSERT OR IGNORE" if ignore else "INSERT"
        cur = conn.execute(f"{verb} INTO {table} ({cols}) VALUES ({marks})", list(row.values()))
        return cur.lastrowid if cur.rowcount else 0

    # -- campaigns -----------------------------------------------------------------------------
    def create_campaign(self, name: str, config: dict, device: str, versions: dict,
                        status: str = "running") -> str:
        cid = uuid.uuid4().hex[:12]
        with self._write() as c:
            if c.execute("select 1 from campaigns where name = ?", [name]).fetchone():
                raise StoreError(f"a campaign named {name!r} exists already (use `kernellab resume {name}`)")
            ts = now()
            self._insert(c, "campaigns", {
                "id": cid, "name": name, "created_at": ts, "updated_at": ts, "status": status,
                "config_json": canonical_json(config), "device": device,
                "versions_json": canonical_json(versions)}, ignore=False)
        return cid

    def get_campaign(self, ref: str) -> dict | None:
        row = self._one("select * from campaigns where id = ? or name = ?", [ref, ref])
        if row is None and len(ref) >= 4:
            rows = self._all("select * from campaigns where id like ?", [ref + "%"])
            row = rows[0] if len(rows) == 1 else None
        return row

    def list_campaigns(self) -> list[dict]:
        return self._all("select * from campaigns order by created_at")

    def update_campaign(self, campaign_id: str, *, status: str | None = None,
                        config: dict | None = None) -> None:
        sets, params = ["updated_at = ?"], [now()]
        if status is not None:
            sets.append("status = ?")
            params.append(status)
        if config is not None:
            sets.append("config_json = ?")
            params.append(canonical_json(config))
        with self._write() as c:
            cur = c.execute(f"update campaigns set {', '.join(sets)} where id = ?", [*params, campaign_id])
            if cur.rowcount == 0:
                raise StoreError(f"no campaign {campaign_id!r}")

    # -- studies (kernellab study / compare) ----------------------------------------------------
    def put_study(self, name: str, suite: str, config: dict) -> None:
        """Create study ``name`` or replace its config (the matrix grows when a study is rerun with
        more policies, agents or seeds); ``created_at`` is kept."""
        ts = now()
        with self._write() as c:
            c.execute("INSERT INTO strategy_studies (name, suite, created_at, updated_at, config_json) VALUES (?,?,?,?,?) "
                      "ON CONFLICT(name) DO UPDATE SET suite = excluded.suite, updated_at = excluded.updated_at, "
                      "config_json = excluded.config_json", [name, suite, ts, ts, canonical_json(config)])

    def get_study(self, name: str) -> dict | None:
        return self._one("select * from strategy_studies where name = ?", [name])

    def list_studies(self) -> list[dict]:
        return self._all("select * from strategy_studies order by created_at")

    # -- problems and candidates ---------------------------------------------------------------
    def add_problem(self, problem: Any) -> str:
        pid = problem.id
        with self._write() as c:
            self._insert(c, "problems", {"id": pid, "name": problem.name, "path": problem.path,
                                         "source": problem.source})
        return pid

    def get_problem(self, problem_id: str) -> dict | None:
        return self._one("select * from problems where id = ? or name = ? order by rowid desc limit 1",
                         [problem_id, problem_id])

    def add_candidate(self, campaign_id: str, problem_id: str, source: str, *,
                      parent_id: str | None = None, parents: Sequence[str] = (),
                      origin: str = "builtin", model: str | None = None, action: str = "",
                      language: str = "triton", space: dict | None = None,
                      meta: dict | None = None) -> str:
        if origin not in ("builtin", "llm", "human", "seed", "inductor"):
            raise StoreError(f"origin {origin!r} is not one of builtin, llm, human, seed, inductor")
        source_hash = _hash(problem_id, source)
        cid = _hash(campaign_id, source_hash)
        with self._write() as c:
            depth = 0
            if parent_id is not None:
                prow = c.execute("select depth from candidates where id = ?", [parent_id]).fetchone()
                if prow is None:
                    raise StoreError(f"parent candidate {parent_id!r} does not exist")
                depth = prow["depth"] + 1
            self._insert(c, "candidates", {
                "id": cid, "campaign_id": campaign_id, "problem_id": problem_id,
                "parent_id": parent_id, "depth": depth, "origin": origin, "model": model,
                "action": action, "language": language, "source": source,
                "space_json": canonical_json(space) if space else None, "created_at": now(),
                "source_hash": source_hash,
                "parents_json": canonical_json(list(parents)) if parents else None,
                "meta_json": canonical_json(meta) if meta else None})
        return cid

    def get_candidate(self, ref: str) -> dict | None:
        row = self._one("select * from candidates where id = ?", [ref])
        if row is None and len(ref) >= 4:
            rows = self._all("select * from candidates where id like ? limit 2", [ref + "%"])
            row = rows[0] if len(rows) == 1 else None
        return row

    def candidates(self, campaign_id: str, problem_id: str | None = None) -> list[dict]:
        if problem_id is None:
            return self._all("select * from candidates where campaign_id = ? order by rowid", [campaign_id])
        return self._all("select * from candidates where campaign_id = ? and problem_id = ? order by rowid",
                         [campaign_id, problem_id])

    def find_by_source_hash(self, source_hash: str) -> list[dict]:
        return self._all("select * from candidates where source_hash = ? order by rowid", [source_hash])

    # -- evaluations and metrics ---------------------------------------------------------------
    @staticmethod
    def evaluation_id(candidate_id: str, config: dict | None, kind: str) -> str:
        return _hash(candidate_id, canonical_json(config or {}), kind)

    def add_evaluation(self, candidate_id: str, result: dict, *, kind: str = "full",
                       metrics: Iterable[tuple[str, str, float]] = ()) -> str:
        status = result.get("status")
        if status not in STATUSES:
            raise StoreError(f"evaluation status {status!r} is not one of {', '.join(STATUSES)}")
        if kind not in KINDS:
            raise StoreError(f"evaluation kind {kind!r} is not one of {', '.join(KINDS)}")
        status, kind = str(status), str(kind)  # an enum member is stored as its value
        config = result.get("config") or {}
        eid = result.get("id") or self.evaluation_id(candidate_id, config, kind)
        known = {"max_abs_err", "max_rel_err", "median_ms", "p20_ms", "p80_ms", "eager_ms", "compile_ms",
                 "speedup_eager", "speedup_compile", "own_kernel_share", "device", "error_class"}
        row = {k: result.get(k) for k in known}
        error = result.get("error_text") or result.get("error")
        row.update({
            "id": eid, "candidate_id": candidate_id, "kind": kind, "config_json": canonical_json(config),
            "status": status, "error_text": (error or "")[:8000] or None,
            "library_only": int(bool(result.get("library_only"))),
            "interpreted": int(bool(result.get("interpreted"))),
            "versions_json": canonical_json(result.get("versions") or {}),
            "details_json": canonical_json(result.get("details") or {}),
            "created_at": now()})
        metric_rows = [(eid, str(k), str(n), float(v)) for k, n, v in metrics if v is not None]
        with self._write() as c:
            camp = c.execute("select campaign_id from candidates where id = ?", [candidate_id]).fetchone()
            if camp is None:
                raise StoreError(f"candidate {candidate_id!r} does not exist")
            row["campaign_id"] = camp["campaign_id"]
            if c.execute("select 1 from evaluations where id = ?", [eid]).fetchone():
                return eid  # recorded already (a resumed campaign re-submitting finished work)
            self._insert(c, "evaluations", row, ignore=False)
            c.executemany("INSERT OR REPLACE INTO metrics (evaluation_id, kernel, name, value) VALUES (?,?,?,?)",
                          metric_rows)
        return eid

    def get_evaluation(self, evaluation_id: str) -> dict | None:
        return self._one("select * from evaluations where id = ?", [evaluation_id])

    def evaluations(self, *, candidate_id: str | None = None, campaign_id: str | None = None,
                    kind: str | None = None) -> list[dict]:
        where, params = [], []
        for col, val in (("candidate_id", candidate_id), ("campaign_id", campaign_id), ("kind", kind)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(str(val))  # a vocabulary enum member as its value
        sql = "select * from evaluations" + (" where " + " and ".join(where) if where else "")
        return self._all(sql + " order by rowid", params)

    def metrics(self, evaluation_id: str) -> list[dict]:
        return self._all("select * from metrics where evaluation_id = ? order by kernel, name", [evaluation_id])

    # -- baselines -----------------------------------------------------------------------------
    def get_baseline(self, key: str) -> dict | None:
        return self._one("select * from baselines where key = ?", [key])

    def put_baseline(self, key: str, row: dict) -> None:
        data = {"key": key, "created_at": now(), **row}
        if isinstance(data.get("versions_json"), dict):
            data["versions_json"] = canonical_json(data["versions_json"])
        with self._write() as c:
            cols = ", ".join(data)
            c.execute(f"INSERT OR REPLACE INTO baselines ({cols}) VALUES ({', '.join('?' for _ in data)})",
                      list(data.values()))

    # -- llm calls and events ------------------------------------------------------------------
    def add_llm_call(self, row: dict) -> str:
        data = dict(row)
        data.setdefault("id", uuid.uuid4().hex)
        data.setdefault("created_at", now())
        for k in ("request_json", "response_json"):
            if k in data and not isinstance(data[k], str):
                data[k] = canonical_json(data[k])
        with self._write() as c:
            self._insert(c, "llm_calls", data, ignore=False)
        return data["id"]

    def llm_calls(self, campaign_id: str | None = None, request_hash: str | None = None) -> list[dict]:
        if request_hash is not None:
            return self._all("select * from llm_calls where request_hash = ? order by rowid", [request_hash])
        if campaign_id is None:
            return self._all("select * from llm_calls order by rowid")
        return self._all("select * from llm_calls where campaign_id = ? order by rowid", [campaign_id])

    def add_event(self, campaign_id: str, kind: str, payload: dict) -> int:
        with self._write() as c:
            cur = c.execute("INSERT INTO events (campaign_id, ts, kind, payload_json) VALUES (?,?,?,?)",
                            [campaign_id, now(), kind, canonical_json(payload)])
            return int(cur.lastrowid)

    def events(self, campaign_id: str, kind: str | None = None) -> list[dict]:
        if kind is None:
            return self._all("select * from events where campaign_id = ? order by id", [campaign_id])
        return self._all("select * from events where campaign_id = ? and kind = ? order by id", [campaign_id, kind])

    # -- queries -------------------------------------------------------------------------------
    def lineage(self, candidate_id: str) -> list[dict]:
        rows = self._all(
            """with recursive up(id, parent_id, n) as (
                 select id, parent_id, 0 from candidates where id = ?
                 union all
                 select c.id, c.parent_id, up.n + 1 from candidates c join up on c.id = up.parent_id
                 where up.n < 10000)
               select c.* from up join candidates c on c.id = up.id order by up.n desc""",
            [candidate_id])
        if not rows:
            raise StoreError(f"no candidate {candidate_id!r}")
        return rows

    def subtree(self, candidate_id: str) -> list[dict]:
        rows = self._all(
            """with recursive down(id, n) as (
                 select id, 0 from candidates where id = ?
                 union all
                 select c.id, down.n + 1 from candidates c join down on c.parent_id = down.id
                 where down.n < 10000)
               select c.* from down join candidates c on c.id = down.id order by down.n, c.rowid""",
            [candidate_id])
        if not rows:
            raise StoreError(f"no candidate {candidate_id!r}")
        return rows

    def best(self, campaign_id: str, problem_id: str | None = None,
             objective: str = DEFAULT_OBJECTIVE, library: bool = True, kernel: bool = False) -> list[dict]:
        if objective not in OBJECTIVES:
            raise StoreError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
        # The order is kernellab.vocab.best_key's (tests/store checks that the two agree): the
        # objective high first, interpreted (CPU) timings, which carry no speedup, after every real
        # one and among themselves the fastest first; ties keep the earlier row.
        # A winner's re-timing is a check of the selection, not a candidate for it (it would make the
        # selection depend on which candidates happened to be re-timed); a (candidate, config) that
        # failed its re-timing is out (vocab.failed_winner_retime).
        winner = f"(w.kind = '{Kind.RETIME.value}' and json_extract(w.details_json, '$.{WINNER_RETIME}') is not null)"
        # vocab.harness_oom: an out-of-memory beside the sandbox's own reference outputs is not the candidate's
        ooms = ", ".join(f"'{k}'" for k in OOM_CLASSES)
        ours = (f"(w.error_class in ({ooms}) "
                "and coalesce(json_extract(w.details_json, '$.memory.refs_on_device_bytes'), 0) > 0)")
        judged = ", ".join(f"'{k}'" for k in JUDGED)
        sql = f"""
            select e.*, c.problem_id, c.action, c.depth, c.origin, c.parent_id, c.language,
                   row_number() over (partition by c.problem_id
                       order by (e.{objective} is null), e.{objective} desc, (e.median_ms is null),
                                e.median_ms asc, e.rowid) as rk
            from evaluations e join candidates c on c.id = e.candidate_id
            where c.campaign_id = ? and e.status = '{Status.CORRECT.value}' and e.kind in ({judged})
              and not (e.kind = '{Kind.RETIME.value}' and json_extract(e.details_json, '$.{WINNER_RETIME}') is not null)
              and not exists (select 1 from evaluations w where w.candidate_id = e.candidate_id
                              and w.config_json = e.config_json and {winner} and w.status != '{Status.CORRECT.value}'
                              and not {ours})
              {"" if library else "and not e.library_only"}
              {"" if not kernel else f"and not e.library_only and (e.interpreted or e.own_kernel_share >= {KERNEL_WIN_SHARE!r})"}
              {"and c.problem_id = ?" if problem_id else ""}"""
        params = [campaign_id] + ([problem_id] if problem_id else [])
        rows = self._all(f"select * from ({sql}) where rk = 1 order by problem_id", params)
        for r in rows:
            r.pop("rk", None)
        return rows

    def reported_best(self, campaign_id: str, problem_id: str | None = None, objective: str | None = None,
                      library: bool = True, kernel: bool = False) -> list[dict]:
        """Per problem, the row every printed number comes from (``status``, ``report``, ``export``,
        ``bench``): the winner under ``objective`` (the campaign's when None), replaced by its latest
        correct fresh-job re-timing when it has one. Extra keys: ``retimed``, ``selected_id`` (the
        evaluation that selected the winner), ``objective``, the baselines' ``eager_p20_ms``..
        ``compile_p80_ms``, ``speedup_eager_p20_p80``/``speedup_compile_p20_p80`` (the speedup at the
        candidate's p80 and p20 times; None when interpreted) and ``win_eager``/``win_compile``/``win``:
        whether the candidate's p80 time is below the baseline's p20 time in the re-timing (None
        where that was not measured: no re-timing yet, an interpreted run, no torch.compile timing)."""
        camp = self.get_campaign(campaign_id)
        if camp is None:
            raise StoreError(f"no campaign {campaign_id!r}")
        objective = objective or (camp.get("config") or {}).get("objective") or DEFAULT_OBJECTIVE
        rows = self.best(camp["id"], problem_id, objective, library=library, kernel=kernel)
        if not rows:
            return []
        latest: dict[tuple[str, str], dict] = {}
        for e in self._all(f"select * from evaluations where campaign_id = ? and kind = '{Kind.RETIME.value}' "
                           f"and status = '{Status.CORRECT.value}' "
                           f"and json_extract(details_json, '$.{WINNER_RETIME}') is not null order by rowid",
                           [camp["id"]]):
            latest[(e["candidate_id"], e["config_json"])] = e
        out = []
        cand_cols = ("problem_id", "action", "depth", "origin", "parent_id", "language")
        for row in rows:
            retime = latest.get((row["candidate_id"], row["config_json"]))
            r = {**retime, **{k: row[k] for k in cand_cols}} if retime else dict(row)
            band = ((r.get("details") or {}).get(WINNER_RETIME) or {}).get("band") or {} if retime else {}
            timing = (r.get("details") or {}).get("timing") or {}
            interp = bool(r.get("interpreted"))
            eager = band.get("eager") or timing.get("eager") or {}
            comp = band.get("compile") or {}
            r.update(retimed=retime is not None, selected_id=row["id"], objective=objective,
                     eager_p20_ms=eager.get("p20_ms"), eager_p80_ms=eager.get("p80_ms"),
                     compile_p20_ms=comp.get("p20_ms"), compile_p80_ms=comp.get("p80_ms"),
                     speedup_eager_p20_p80=None if interp else _speedup_band(r, "eager_ms"),
                     speedup_compile_p20_p80=None if interp else _speedup_band(r, "compile_ms"),
                     win_eager=band.get("win_eager"), win_compile=band.get("win_compile"))
            r["win"] = r["win_eager"] if objective == "speedup_eager" else r["win_compile"]
            out.append(r)
        return out

    def summary(self, campaign_id: str) -> dict:
        camp = self.get_campaign(campaign_id)
        if camp is None:
            raise StoreError(f"no campaign {campaign_id!r}")
        cid = camp["id"]
        with self._lock:
            statuses = {r[0]: r[1] for r in self._conn.execute(
                f"select status, count(*) from evaluations where campaign_id = ? and kind = '{Kind.FULL.value}' "
                "group by status",
                [cid])}
            n_cand = self._conn.execute("select count(*) from candidates where campaign_id = ?", [cid]).fetchone()[0]
            n_eval = self._conn.execute("select count(*) from evaluations where campaign_id = ?", [cid]).fetchone()[0]
            llm = self._conn.execute(
                "select count(*), coalesce(sum(input_tokens),0), coalesce(sum(output_tokens),0), "
                "coalesce(sum(cost_usd),0) from llm_calls where campaign_id = ?", [cid]).fetchone()
        problems = []
        for b in self.reported_best(cid):
            prob = self.get_problem(b["problem_id"])
            problems.append({"problem_id": b["problem_id"], "problem": prob["name"] if prob else None,
                             "candidate_id": b["candidate_id"], "evaluation_id": b["id"], "kind": b["kind"],
                             "retimed": b["retimed"], "status": b["status"], "config": b.get("config") or {},
                             "median_ms": b["median_ms"], "p20_ms": b["p20_ms"], "p80_ms": b["p80_ms"],
                             "eager_ms": b["eager_ms"], "compile_ms": b["compile_ms"],
                             "speedup_eager": b["speedup_eager"], "speedup_compile": b["speedup_compile"],
                             "speedup_eager_p20_p80": b["speedup_eager_p20_p80"],
                             "speedup_compile_p20_p80": b["speedup_compile_p20_p80"],
                             "win_eager": b["win_eager"], "win_compile": b["win_compile"],
                             "interpreted": bool(b["interpreted"]),
                             "library_only": bool(b["library_only"]), "action": b["action"]})
        return {"campaign": {k: camp[k] for k in ("id", "name", "status", "created_at", "device")},
                "candidates": n_cand, "evaluations": n_eval, "statuses": statuses,
                "llm": {"calls": llm[0], "input_tokens": llm[1], "output_tokens": llm[2], "cost_usd": llm[3]},
                "best": problems}


def _speedup_band(e: dict, base: str) -> list[float] | None:
    """[baseline / p80, baseline / p20]: the speedup at the candidate's slow and fast ends."""
    b, p20, p80 = e.get(base), e.get("p20_ms"), e.get("p80_ms")
    return [b / p80, b / p20] if b and p20 and p80 else None


def open_store(path: str | os.PathLike = "kernellab.db") -> SQLiteStore:
    return SQLiteStore(path)
