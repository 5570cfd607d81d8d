"""The kernellab store: one SQLite file holding campaigns, problems, the candidate tree,
evaluations, Nsight Compute metrics, LLM calls and agent events (docs/ARCHITECTURE.md "kernellab.store").

Optuna studies and LangGraph checkpoints live in the same file, in their own tables.
"""

from __future__ import annotations

from ._base import WINNER_RETIME, BaseStore, StoreError, canonical_json, is_winner_retime, now
from ._sqlite import SQLiteStore, open_store

Store = SQLiteStore

__all__ = ["BaseStore", "SQLiteStore", "Store", "StoreError", "open_store", "canonical_json", "now",
           "STATUSES", "OBJECTIVES", "WINNER_RETIME", "is_winner_retime"]

STATUSES = ("compile_error", "runtime_error", "timeout", "crash", "incorrect", "rejected", "correct")
OBJECTIVES = ("speedup_eager", "speedup_compile")
