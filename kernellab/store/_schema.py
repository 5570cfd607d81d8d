"""Named migrations of the kernellab schema (sqlite-utils ``Migrations``).

Append new migrations at the end; never edit one that has shipped. A database whose applied
migrations include a name this list does not know was written by newer code, and is refused.
"""

from __future__ import annotations

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

MIGRATION_SET = "kernellab"
migrations = Migrations(MIGRATION_SET)


@migrations(name="0001_initial")
def _initial(db: Database) -> None:
    db["campaigns"].create(
        {"id": str, "name": str, "created_at": str, "status": str, "config_json": str,
         "device": str, "versions_json": str, "updated_at": str},
        pk="id",
    )
    db["campaigns"].create_index(["name"], unique=True)
    db["problems"].create({"id": str, "name": str, "path": str, "source": str}, pk="id")
    db["candidates"].create(
        {"id": str, "campaign_id": str, "problem_id": str, "parent_id": str, "depth": int,
         "origin": str, "model": str, "action": str, "language": str, "source": str,
         "space_json": str, "created_at": str, "source_hash": str, "parents_json": str,
         "meta_json": str},
        pk="id",
        foreign_keys=[("campaign_id", "campaigns", "id"), ("problem_id", "problems", "id")],
    )
    db["candidates"].create_index(["campaign_id", "problem_id"])
    db["candidates"].create_index(["parent_id"])
    db["candidates"].create_index(["source_hash"])
    db["evaluations"].create(
        {"id": str, "candidate_id": str, "campaign_id": str, "kind": str, "config_json": str,
         "status": str, "error_text": str, "error_class": str, "max_abs_err": float,
         "max_rel_err": float, "median_ms": float, "p20_ms": float, "p80_ms": float,
         "eager_ms": float, "compile_ms": float, "speedup_eager": float, "speedup_compile": float,
         "own_kernel_share": float, "library_only": int, "interpreted": int, "device": str,
         "versions_json": str, "details_json": str, "created_at": str},
        pk="id",
        foreign_keys=[("candidate_id", "candidates", "id")],
    )
    db["evaluations"].create_index(["candidate_id"])
    db["evaluations"].create_index(["campaign_id"])
    db["metrics"].create(
        {"evaluation_id": str, "kernel": str, "name": str, "value": float},
        pk=("evaluation_id", "kernel", "name"),
        foreign_keys=[("evaluation_id", "evaluations", "id")],
    )
    db["llm_calls"].create(
        {"id": str, "campaign_id": str, "candidate_id": str, "role": str, "model": str,
         "input_tokens": int, "output_tokens": int, "cache_read_tokens": int,
         "cache_write_tokens": int, "cost_usd": float, "latency_s": float, "request_hash": str,
         "request_json": str, "response_json": str, "prompt_version": str, "created_at": str},
        pk="id",
    )
    db["llm_calls"].create_index(["campaign_id"])
    db["llm_calls"].create_index(["request_hash"])
    db["events"].create(
        {"id": int, "campaign_id": str, "ts": str, "kind": str, "payload_json": str}, pk="id",
    )
    db["events"].create_index(["campaign_id", "kind"])
    db["baselines"].create(
        {"key": str, "problem_id": str, "device": str, "versions_json": str, "small": int,
         "eager_ms": float, "compile_ms": float, "compile_p20_ms": float, "compile_p80_ms": float,
         "created_at": str},
        pk="key",
    )
    # Finished evaluations are immutable: the database itself refuses to change or drop them.
    db.execute(
        "CREATE TRIGGER evaluations_immutable BEFORE UPDATE ON evaluations "
        "BEGIN SELECT RAISE(ABORT, 'kernellab: finished evaluations are immutable'); END"
    )
    db.execute(
        "CREATE TRIGGER evaluations_undeletable BEFORE DELETE ON evaluations "
        "BEGIN SELECT RAISE(ABORT, 'kernellab: finished evaluations are immutable'); END"
    )


@migrations(name="0002_strategy_studies")
def _studies(db: Database) -> None:
    # A study (`kernellab study`) is a matrix of bench cells (policy x agents x seed) over one suite;
    # config_json holds the suite, the shared settings and each cell with its bench config hash, so
    # `kernellab compare --study` knows the whole matrix, cells not run yet included.
    # not "studies": Optuna keeps its own table of that name in the same file
    db["strategy_studies"].create({"name": str, "suite": str, "created_at": str, "updated_at": str, "config_json": str},
                         pk="name")


KNOWN = [m.name for m in migrations._migrations]
