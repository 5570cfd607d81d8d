"""The shared vocabulary: words and rules that several parts of kernellab must agree on, written once.

- :class:`Status` -- an evaluation's outcome; :data:`STATUSES`, :data:`FAILED`.
- :class:`Kind` -- what an evaluation row is: ``full`` (the judged evaluation of a candidate),
  ``trial`` (an Optuna trial), ``retime`` (a full re-timing: of a tuned config, or, marked
  ``details.winner_retime``, of a problem's winner), ``profile`` (an ncu run carrying metrics).
  :data:`JUDGED` kinds can make a candidate's score; :func:`is_judged` leaves winners' re-timings out.
- :data:`OBJECTIVES` and "the best evaluation" under one: :func:`best_key` orders evaluations
  (objective high first, then median time low; ties keep the earlier row), :func:`best_evaluation` picks
  the selection from a list as ``store.best`` does in SQL (``tests/store`` checks that they agree).
- ``SPACE``/``CONFIG``: :func:`read_space` reads the literals without running the candidate,
  :func:`flatten_space`/:func:`unflatten` give Optuna flat names (``"g_linear.BLOCK_M"``), and
  :func:`apply_config` is the one way a config is applied to a candidate's ``CONFIG`` (a nested merge:
  ``{"g": {"BLOCK": 64}}`` changes one entry of kernel ``g``, never drops its others); the sandbox, the
  profiling target and ``export`` all use it.
- :func:`canonical_json` (stable text for hashing) and :data:`SEED`, the sandbox's default seed.
- :func:`small_for`: ``small=None`` means SMALL sizes on the CPU (and full sizes on a GPU).
- :data:`VERSION_KEYS`: the software versions an evaluation's baseline and its reuse key on.
- :data:`KERNEL_WIN_SHARE`, :func:`share_wins` and :func:`counts_as_kernel_win`: what a kernel win is.
- :data:`RESUMABLE_STOPS` (:data:`LLM_STOPS` among them) and :func:`stops_resumably`: the exceptions that
  stop a campaign saved and resumable rather than failing it.

Standard library only: the sandbox worker, the store and the GPU benchmarks import it.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

__all__ = ["SEED", "Status", "STATUSES", "FAILED", "Kind", "KINDS", "JUDGED", "WINNER_RETIME",
           "is_winner_retime", "OOM_CLASSES", "harness_oom", "failed_winner_retime", "is_judged", "OBJECTIVES", "DEFAULT_OBJECTIVE",
           "check_objective", "best_key",
           "best_evaluation", "canonical_json", "SpaceError", "ConfigError", "SEP", "read_space",
           "space_from_source", "is_nested", "flatten_space", "unflatten", "apply_config", "small_for",
           "VERSION_KEYS", "KERNEL_WIN_SHARE", "share_wins", "counts_as_kernel_win", "LLM_STOPS", "RESUMABLE_STOPS",
           "stops_resumably"]

# Seeds the model weights (Model and ModelNew alike) and, offset per trial, the inputs: in the
# sandbox's jobs and in the profiled process, so that a profile sees the inputs an evaluation saw.
SEED = 1234


class Status(str, Enum):
    """The outcome of one evaluation; the value is what the store holds."""

    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASH = "crash"
    INCORRECT = "incorrect"
    REJECTED = "rejected"  # failed an integrity check
    CORRECT = "correct"

    def __str__(self) -> str:
        return self.value


STATUSES = tuple(s.value for s in Status)
FAILED = tuple(s.value for s in Status if s is not Status.CORRECT)


class Kind(str, Enum):
    """What an evaluation row is (the store's ``evaluations.kind``)."""

    FULL = "full"
    TRIAL = "trial"
    RETIME = "retime"
    PROFILE = "profile"

    def __str__(self) -> str:
        return self.value


KINDS = tuple(k.value for k in Kind)
JUDGED = (Kind.FULL.value, Kind.RETIME.value)  # kinds that can make a candidate's score

# ``details`` key that marks a ``retime`` row as the fresh-job re-timing of a problem's winner
# (kernellab.campaign.retime_winners), as opposed to the tuner's re-timings of its best configs
WINNER_RETIME = "winner_retime"


def is_winner_retime(evaluation: dict) -> bool:
    """Whether an evaluation record is the fresh-job re-timing of a problem's winner."""
    return evaluation.get("kind") == Kind.RETIME and bool((evaluation.get("details") or {}).get(WINNER_RETIME))


# the out-of-memory error classes: the candidate's (``oom``) and our machinery's (``infra:oom``)
OOM_CLASSES = ("oom", "infra:oom")


def harness_oom(evaluation: dict) -> bool:
    """An out-of-memory of ours, not the candidate's: its job kept reference outputs of the sandbox's own on the
    device (``details.memory.refs_on_device_bytes``). The sandbox retries such a job without them
    (``sandbox._gpu.retry_admission``); before it did, two of KernelBench's winners (34_InstanceNorm,
    35_GroupNorm_, torch.compile's code) failed their re-timing so beside 45 GB of them on the H200."""
    mem = (evaluation.get("details") or {}).get("memory") or {}
    return evaluation.get("error_class") in OOM_CLASSES and int(mem.get("refs_on_device_bytes") or 0) > 0


def failed_winner_retime(evaluation: dict) -> bool:
    """A winner's re-timing that failed, through the candidate (:func:`harness_oom` excepted): its (candidate,
    config) is out of the selection."""
    return (is_winner_retime(evaluation) and evaluation.get("status") != Status.CORRECT
            and not harness_oom(evaluation))


def is_judged(evaluation: dict) -> bool:
    """A row that can make its candidate's score: ``full`` or ``retime``, but not a winner's re-timing,
    which checks the selection (``store.reported_best`` reports it): scoring it too would let a
    re-timed candidate outrank itself by noise."""
    return evaluation.get("kind") in JUDGED and not is_winner_retime(evaluation)


# -- the best evaluation under an objective --------------------------------------------------------
OBJECTIVES = ("speedup_eager", "speedup_compile")
DEFAULT_OBJECTIVE = "speedup_eager"


def check_objective(objective: str) -> str:
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    return objective


def best_key(objective: str) -> Callable[[dict], tuple]:
    """Sort key, best first (use with ``min``/``sorted``; ties keep the earlier row): the objective's
    speedup high first, rows without one last (interpreted timings claim no speedup), then the median
    time low first. The store's ``best`` orders its SQL the same way."""
    check_objective(objective)

    def key(e: dict) -> tuple:
        value, ms = e.get(objective), e.get("median_ms")
        return (value is None, -(value or 0.0), ms is None, ms or 0.0)

    return key


def best_evaluation(evaluations: Iterable[dict], objective: str = DEFAULT_OBJECTIVE,
                    library: bool = True, kernel: bool = False) -> dict | None:
    """The selection among one problem's evaluation rows (in the order they were written), the rule of
    ``store.best``: correct and judged, not library-only unless ``library``, only kernel wins
    (:func:`counts_as_kernel_win`) where ``kernel``, and no (candidate, config) whose winner re-timing failed
    (:func:`failed_winner_retime`);
    the first under :func:`best_key`."""
    rows = list(evaluations)
    failed = {(e["candidate_id"], _config_text(e)) for e in rows if failed_winner_retime(e)}
    eligible = [e for e in rows if e.get("status") == Status.CORRECT and is_judged(e)
                and (library or not e.get("library_only")) and (not kernel or counts_as_kernel_win(e))
                and (e["candidate_id"], _config_text(e)) not in failed]
    return min(eligible, key=best_key(objective), default=None)


def _config_text(e: dict) -> str:
    return e["config_json"] if "config_json" in e else canonical_json(e.get("config") or {})


def canonical_json(obj: Any) -> str:
    """Stable JSON: the same object always gives the same text (keys sorted), so it can be hashed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


# -- SPACE and CONFIG ------------------------------------------------------------------------------
class SpaceError(ValueError):
    """A ``SPACE`` (or its ``CONFIG``) that cannot be read or tuned; the message names the parameter."""


class ConfigError(ValueError):
    """A config that cannot be applied to a candidate (no ``CONFIG`` dict, or keys it does not know)."""


SEP = "."  # per-kernel parameters flattened for Optuna: "g_linear.BLOCK_M"


def read_space(source: str) -> tuple[dict | None, dict | None]:
    """The module-level ``SPACE`` and ``CONFIG`` literals of a candidate, read from its syntax tree:
    candidate code is never executed outside the sandbox. Tuples stay tuples (they are ranges)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise SpaceError(f"candidate source does not parse (line {exc.lineno}: {exc.msg})") from None
    return _literal(tree, "SPACE"), _literal(tree, "CONFIG")


def _literal(tree: ast.Module, name: str) -> Any:
    """The value of the last module-level assignment to ``name``, which must be a literal."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            try:
                found = ast.literal_eval(node.value)
            except ValueError:
                raise SpaceError(f"{name} (line {node.lineno}) must be a literal dict: it is read "
                                 "without running the candidate") from None
    return found


def space_from_source(source: str) -> dict | None:
    """The candidate's ``SPACE`` as the store keeps it (``candidates.space_json``: JSON, so ranges
    become lists), or None when it has none or it cannot be read (not a literal, a syntax error)."""
    try:
        space = _literal(ast.parse(source), "SPACE")
    except (SyntaxError, SpaceError):
        return None
    return json.loads(json.dumps(space, default=str)) if isinstance(space, dict) else None


def is_nested(space: Any) -> bool:
    """Whether a SPACE holds per-kernel dicts (``{"g_linear": {"BLOCK_M": [64, 128]}}``)."""
    return isinstance(space, dict) and any(isinstance(v, dict) for v in space.values())


def _flat(d: dict) -> dict:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update({f"{k}{SEP}{ik}": iv for ik, iv in v.items()})
        else:
            out[k] = v
    return out


def flatten_space(space: Any, config: dict | None) -> tuple[Any, dict | None]:
    """Per-kernel parameters as Optuna sees them (``"gemm1.BLOCK_M"``); CONFIG is flattened alike.
    A flat SPACE comes back as it is; :func:`unflatten` gives the candidate its nested form back."""
    if not is_nested(space):
        return space, config
    return _flat(space), _flat(config or {})


def unflatten(config: dict, nested: bool) -> dict:
    if not nested:
        return dict(config)
    out: dict[str, Any] = {}
    for k, v in config.items():
        if SEP in k:
            outer, inner = k.split(SEP, 1)
            out.setdefault(outer, {})[inner] = v
        else:
            out[k] = v
    return out


def apply_config(cfg: Any, config: dict | None, space: dict | None = None) -> Any:
    """Apply ``config`` to a candidate's ``CONFIG`` dict ``cfg`` in place (and return it): a per-kernel
    entry is merged into the kernel's dict, not put in its place, so a config naming some of a kernel's
    parameters keeps the others. Keys must be in ``cfg`` or ``space`` (:class:`ConfigError`)."""
    if not config:
        return cfg
    if not isinstance(cfg, dict):
        raise ConfigError(f"a config {config} was given but the candidate has no CONFIG dict")
    unknown = [k for k in config if k not in cfg and k not in (space or {})]
    if unknown:
        raise ConfigError(f"config keys {unknown} are in neither CONFIG nor SPACE of the candidate")
    for k, v in config.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k].update(v)
        else:
            cfg[k] = v
    return cfg


def small_for(device_kind: str | None, small: bool | None) -> bool:
    """Whether a job runs the SMALL instance: ``small`` when given, else off a GPU only (``device_kind``
    "cpu", "cuda" or "cuda:N"; a GPU runs the problem's full sizes, the Triton interpreter on a CPU cannot)."""
    return not str(device_kind or "").startswith("cuda") if small is None else bool(small)


# the software versions an evaluation's eager/compile baseline is cached on, and a reused evaluation must match
VERSION_KEYS = ("torch", "triton", "cuda", "driver", "python")

# A kernel win needs at least this share of the GPU time in the candidate's own kernels (the sandbox
# records ``details.kernel_win_eligible`` by it, and bench and compare count wins by it).
KERNEL_WIN_SHARE = 0.5


def share_wins(library_only: bool, share: float | None) -> bool:
    """The kernel-win rule on a measured share: not library-only, and at least :data:`KERNEL_WIN_SHARE` of
    the time in the candidate's own kernels."""
    return not library_only and share is not None and share >= KERNEL_WIN_SHARE


def counts_as_kernel_win(e: dict, allow_library: bool = False) -> bool:
    """An evaluation that counts as a kernel win: :func:`share_wins` on its ``own_kernel_share``. The
    interpreter's share is Python wall time, not GPU time (a one-kernel softmax measures 0.15 there), so an
    interpreted run, which claims no speedup anyway, needs only a launch of its own (not library-only).
    ``allow_library``: every evaluation counts (bench --allow-library)."""
    if allow_library:
        return True
    if e["library_only"]:
        return False
    if e["interpreted"]:
        return True
    return share_wins(False, e.get("own_kernel_share"))


# The exceptions (by class name: the CLI reads them without importing the LLM backends) after which a
# campaign stops saved and resumable: an LLM budget spent, the LLM service unavailable, a replay without
# the call, and a sandbox that cannot evaluate at all. LLM_STOPS are the LLM backends' own.
LLM_STOPS = ("BudgetExceeded", "LLMUnavailable", "ReplayMiss")
RESUMABLE_STOPS = (*LLM_STOPS, "SandboxUnavailable")


def stops_resumably(exc: BaseException) -> bool:
    """Whether ``exc`` is one of :data:`RESUMABLE_STOPS`."""
    return type(exc).__name__ in RESUMABLE_STOPS
