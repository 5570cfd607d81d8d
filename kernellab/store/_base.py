from __future__ import annotations

import abc
import datetime as _dt
from collections.abc import Iterable, Sequence
from typing import Any


class StoreError(RuntimeError):
    """The database cannot be used: not a kernellab database, written by newer code, or a bad reference."""


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


class BaseStore(abc.ABC):
    """What every kernellab store guarantees; the conformance suite in ``tests/store`` checks it.

    - **Thread-safe**: one store object may be shared by threads; each method is one transaction.
    - **Several processes** may write the same file at once (WAL, busy timeout, ``BEGIN IMMEDIATE``):
      nothing written by either is lost.
    - **Content-hash ids**: problems by the hash of their source; candidates by the hash of
      (campaign, problem, source) with ``source_hash`` = hash of (problem, source) shared across
      campaigns; evaluations by the hash of (candidate, config, kind). Adding something that exists
      returns the existing id and writes nothing, which makes resumed campaigns idempotent.
    - **Atomic**: an evaluation and its metrics are written in one transaction, or not at all.
    - **Finished evaluations are immutable**: never updated or deleted (the file enforces it).
    - **Returned records are snapshots**: plain dicts (JSON columns decoded into ``*_json`` keys'
      siblings without the suffix); changing them changes nothing stored.
    - **Refusal**: a file that is not a kernellab database, or whose schema is newer than this
      code, raises :class:`StoreError` and is never modified.
    """

    # -- campaigns -----------------------------------------------------------------------------
    @abc.abstractmethod
    def create_campaign(self, name: str, config: dict, device: str, versions: dict,
                        status: str = "running") -> str: ...

    @abc.abstractmethod
    def get_campaign(self, ref: str) -> dict | None:
        """By id, id prefix or name."""

    @abc.abstractmethod
    def list_campaigns(self) -> list[dict]: ...

    @abc.abstractmethod
    def update_campaign(self, campaign_id: str, *, status: str | None = None,
                        config: dict | None = None) -> None: ...

    # -- problems and candidates ---------------------------------------------------------------
    @abc.abstractmethod
    def add_problem(self, problem: Any) -> str: ...

    @abc.abstractmethod
    def get_problem(self, problem_id: str) -> dict | None: ...

    @abc.abstractmethod
    def add_candidate(self, campaign_id: str, problem_id: str, source: str, *,
                      parent_id: str | None = None, parents: Sequence[str] = (),
                      origin: str = "builtin", model: str | None = None, action: str = "",
                      language: str = "triton", space: dict | None = None,
                      meta: dict | None = None) -> str: ...

    @abc.abstractmethod
    def get_candidate(self, ref: str) -> dict | None:
        """By id or unique id prefix."""

    @abc.abstractmethod
    def candidates(self, campaign_id: str, problem_id: str | None = None) -> list[dict]: ...

    # -- evaluations and metrics ---------------------------------------------------------------
    @abc.abstractmethod
    def add_evaluation(self, candidate_id: str, result: dict, *, kind: str = "full",
                       metrics: Iterable[tuple[str, str, float]] = ()) -> str: ...

    @abc.abstractmethod
    def get_evaluation(self, evaluation_id: str) -> dict | None: ...

    @abc.abstractmethod
    def evaluations(self, *, candidate_id: str | None = None, campaign_id: str | None = None,
                    kind: str | None = None) -> list[dict]: ...

    @abc.abstractmethod
    def metrics(self, evaluation_id: str) -> list[dict]: ...

    # -- baselines (torch.compile timing cache) ------------------------------------------------
    @abc.abstractmethod
    def get_baseline(self, key: str) -> dict | None: ...

    @abc.abstractmethod
    def put_baseline(self, key: str, row: dict) -> None: ...

    # -- llm calls and events ------------------------------------------------------------------
    @abc.abstractmethod
    def add_llm_call(self, row: dict) -> str: ...

    @abc.abstractmethod
    def llm_calls(self, campaign_id: str | None = None, request_hash: str | None = None) -> list[dict]: ...

    @abc.abstractmethod
    def add_event(self, campaign_id: str, kind: str, payload: dict) -> int: ...

    @abc.abstractmethod
    def events(self, campaign_id: str, kind: str | None = None) -> list[dict]: ...

    # -- queries -------------------------------------------------------------------------------
    @abc.abstractmethod
    def lineage(self, candidate_id: str) -> list[dict]:
        """Candidates from the root to ``candidate_id`` (inclusive)."""

    @abc.abstractmethod
    def subtree(self, candidate_id: str) -> list[dict]:
        """``candidate_id`` and every descendant, parents before children."""

    @abc.abstractmethod
    def best(self, campaign_id: str, problem_id: str | None = None,
             objective: str = "speedup_eager", library: bool = True, kernel: bool = False) -> list[dict]:
        """Per problem, the best correct judged evaluation (joined with its candidate): the
        *selection* of the winner. Winners' re-timings never take part, and a (candidate, config)
        whose re-timing failed is out. ``library=False`` leaves out library-only evaluations; ``kernel``
        keeps only those that count as kernel wins (``vocab.counts_as_kernel_win``): a benchmark's winner."""

    @abc.abstractmethod
    def reported_best(self, campaign_id: str, problem_id: str | None = None, objective: str | None = None,
                      library: bool = True, kernel: bool = False) -> list[dict]:
        """Per problem, the number kernellab prints: the winner (:meth:`best` under ``objective``,
        default the campaign's, ``library`` and ``kernel`` as there) replaced by its latest fresh-job
        re-timing when it has one."""

    @abc.abstractmethod
    def summary(self, campaign_id: str) -> dict: ...
