"""Cross-campaign result reuse: a candidate source evaluated before, by any campaign in the store,
under the same conditions, is not evaluated again.

The candidate rows differ per campaign (``candidates.id`` hashes the campaign too), but their
``source_hash`` is the content hash of (problem, source): the same seed or the same proposal in
another campaign finds the earlier campaign's ``full`` evaluation through it. That evaluation is
reused only when it would have come out the same here, within the noise of a fresh job:

- the same ``config`` (a campaign's evaluate step runs the candidate's own ``CONFIG``: ``{}``);
- the same device name and the same :data:`VERSION_KEYS` (the versions the baseline cache keys on);
- the same job settings (:func:`settings`: correctness trials, SMALL sizes, the problem's mode), as
  recorded in ``details.settings`` by the campaign that made it (older rows have none: never reused);
- on a GPU campaign never an interpreted one; never a ``timeout`` (a verdict of the machine's load
  as much as of the candidate); never a trial, a re-timing or a profile row (kind ``full`` only).
"""

from __future__ import annotations

from typing import Any

from kernellab.problem import content_hash
from kernellab.vocab import VERSION_KEYS, Kind, Status, canonical_json

__all__ = ["VERSION_KEYS", "settings", "find_reusable", "reused_result"]


# store columns that name the row itself, not the outcome
_OWN = ("id", "candidate_id", "campaign_id", "kind", "created_at", "config_json", "versions_json", "details_json")


def settings(*, trials: int, small: bool, mode: str) -> dict:
    """The job settings an evaluation's outcome depends on besides the source, device and versions."""
    return {"trials": int(trials), "small": bool(small), "mode": str(mode)}


def _versions(v: dict | None) -> dict:
    return {k: (v or {}).get(k) for k in VERSION_KEYS}


def find_reusable(store: Any, problem_id: str, source: str, *, device: str, versions: dict, job: dict,
                  gpu: bool, config: dict | None = None, exclude: str | None = None) -> dict | None:
    """The earliest ``full`` evaluation of ``source`` for ``problem_id``, from any campaign, made on
    ``device`` (a device name, as evaluations record it) with ``versions`` and the job settings ``job``
    (:func:`settings`), with ``config``; None when there is none. ``exclude``: a candidate id to skip
    (the one being evaluated). An original row is preferred to one that was itself reused."""
    want_versions, want_config = _versions(versions), canonical_json(config or {})
    found = []
    for cand in store.find_by_source_hash(content_hash(problem_id, source)):
        if cand["id"] == exclude or cand["problem_id"] != problem_id:
            continue
        for e in store.evaluations(candidate_id=cand["id"], kind=Kind.FULL):
            details = e.get("details") or {}
            if (e["status"] == Status.TIMEOUT or (gpu and e.get("interpreted")) or e.get("device") != device
                    or canonical_json(e.get("config") or {}) != want_config or details.get("settings") != job
                    or _versions(e.get("versions")) != want_versions):
                continue
            found.append(e)
    found.sort(key=lambda e: ("reused_from" in (e.get("details") or {}), e["created_at"]))
    return found[0] if found else None


def reused_result(evaluation: dict) -> dict:
    """``evaluation`` (a store row) as a result to record for another candidate: the same outcome,
    ``details.reused_from`` = the id of the original evaluation, and no device time spent."""
    out = {k: v for k, v in evaluation.items() if k not in _OWN}
    details = dict(evaluation.get("details") or {})
    details["reused_from"] = details.get("reused_from") or evaluation["id"]
    details["gpu_s"] = 0.0  # the budget counts device time this campaign spent: none
    out["details"] = details
    return out
