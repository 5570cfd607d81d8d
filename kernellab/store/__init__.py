"""The kernellab store: one SQLite file holding campaigns, problems, the candidate tree,
evaluations, Nsight Compute metrics, LLM calls and agent events (docs/ARCHITECTURE.md "kernellab.store").

Optuna studies and LangGraph checkpoints live in the same file, in their own tables.
"""

from __future__ import annotations

from kernellab.vocab import (
           OBJECTIVES,
           STATUSES,
           WINNER_RETIME,
           Kind,
           Status,
           canonical_json,
           is_winner_retime,
)

from ._base import BaseStore, StoreError, now
from ._sqlite import SQLiteStore, open_store

Store = SQLiteStore

__all__ = ["BaseStore", "SQLiteStore", "Store", "StoreError", "open_store", "canonical_json", "now",
           "STATUSES", "OBJECTIVES", "WINNER_RETIME", "is_winner_retime", "Status", "Kind"]
