"""Optuna over a candidate's ``SPACE``: one study per candidate, in the campaign's own database.

The pruning rules, in the order a study meets them:
- the candidate's ``CONFIG`` is enqueued, so trial 0 is the default the coder wrote;
- a configuration proposed again is not re-evaluated (its first outcome is told again);
- trials use the sandbox's cheaper timing, several in flight where the executor has workers (ask/tell);
- a trial whose first repetitions are already > ``early_stop`` x the best median so far stops there
  (told ``PRUNED``, its partial median reported as the intermediate value TPE ranks it by);
- a failing configuration (compile error, out of resources, incorrect, ...) is told ``FAIL``, with
  its status and reason as user attributes;
- the best ``retime_top`` configurations are re-timed with full timing (``retime`` evaluations); the
  fastest correct one is the candidate's best config.
Every trial is also an evaluation row (``kind="trial"``). ``optuna-dashboard sqlite:///kernellab.db``
shows the studies: they are plain Optuna storage.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
import weakref
from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait
from dataclasses import asdict, dataclass, field
from typing import Any

# the vocabulary's SPACE/CONFIG reading, also this module's public names (tests, experiments/bench_tuning.py)
from kernellab.vocab import DEFAULT_OBJECTIVE, Kind, SpaceError, best_key, canonical_json, check_objective, flatten_space, is_nested, read_space, unflatten

__all__ = ["SpaceError", "read_space", "parse_space", "space_size", "make_sampler", "tune", "TuneResult",
           "study_name", "optuna_storage"]

_CHOICE_TYPES = (type(None), bool, int, float, str)


def parse_space(space: Any, config: dict | None = None) -> dict[str, Any]:
    """Optuna distributions for ``SPACE`` (README.md "A problem, a candidate"): a list of choices, an
    ``(low, high)`` range (ints, or floats), or ``(low, high, "log")``. ``config`` values of tuned
    parameters must lie in the space."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if not isinstance(space, dict) or not space:
        raise SpaceError(f"SPACE must be a non-empty dict of name -> choices or range, got {space!r:.80}")
    dists: dict[str, Any] = {}
    for name, spec in space.items():
        where = f"SPACE[{name!r}]"
        if not isinstance(name, str):
            raise SpaceError(f"{where}: parameter names are strings")
        if isinstance(spec, list):
            if not spec:
                raise SpaceError(f"{where}: an empty list of choices")
            bad = [c for c in spec if not isinstance(c, _CHOICE_TYPES)]
            if bad:
                raise SpaceError(f"{where}: choices are None, bool, int, float or str; got {bad[0]!r}")
            if len({canonical_json(c) for c in spec}) != len(spec):
                raise SpaceError(f"{where}: repeated choices in {spec}")
            dists[name] = CategoricalDistribution(tuple(spec))
        elif isinstance(spec, tuple) and len(spec) in (2, 3):
            low, high, log = spec[0], spec[1], len(spec) == 3
            if log and spec[2] != "log":
                raise SpaceError(f"{where}: the third element of a range may only be \"log\", got {spec[2]!r}")
            nums = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high))
            if not nums or low > high:
                raise SpaceError(f"{where}: a range is (low, high) numbers with low <= high, got {spec}")
            if log and low <= 0:
                raise SpaceError(f"{where}: a log range needs low > 0, got {spec}")
            both_int = isinstance(low, int) and isinstance(high, int)
            dists[name] = (IntDistribution(low, high, log=log) if both_int
                           else FloatDistribution(float(low), float(high), log=log))
        else:
            raise SpaceError(f"{where}: expected a list of choices, (low, high) or (low, high, \"log\"); got {spec!r}")
    for name, value in (config or {}).items():
        if name in dists and not _contains(dists[name], value):
            raise SpaceError(f"CONFIG[{name!r}] = {value!r} lies outside SPACE[{name!r}]")
    return dists


def _contains(dist: Any, value: Any) -> bool:
    if hasattr(dist, "choices"):
        return any(canonical_json(value) == canonical_json(c) for c in dist.choices)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and dist.low <= value <= dist.high


def space_size(dists: dict[str, Any]) -> int | None:
    """How many distinct configurations; None when a float range makes it unbounded."""
    n = 1
    for d in dists.values():
        if hasattr(d, "choices"):
            n *= len(d.choices)
        elif type(d).__name__ == "IntDistribution":
            n *= (d.high - d.low) // d.step + 1
        else:
            return None
    return n


# -- the study -------------------------------------------------------------------------------------
_STORAGES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_STORAGES_LOCK = threading.Lock()


def optuna_storage(store: Any) -> Any:
    """The campaign database as Optuna storage, one per store object: a ``":memory:"`` store's in memory, a file's
    an ``RDBStorage`` (its engine's sessions are per thread). Making one of those imports Optuna, SQLAlchemy and
    Alembic and checks the schema, 3-4 s before a solo campaign's first trial on the H200."""
    import optuna

    with _STORAGES_LOCK:
        if store not in _STORAGES:
            if getattr(store, "memory", False):
                _STORAGES[store] = optuna.storages.InMemoryStorage()
            else:
                from pathlib import Path

                url = f"sqlite:///{Path(store.path).resolve()}"
                _STORAGES[store] = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
        return _STORAGES[store]


def prewarm_storage(store: Any) -> threading.Thread:
    """:func:`optuna_storage` made in a background thread: a campaign starts it while it waits for its first
    evaluation, so that its first tuning does not make it. Failures are left to the tuning to meet."""

    def make() -> None:
        with contextlib.suppress(Exception):
            optuna_storage(store)

    t = threading.Thread(target=make, name="kernellab-optuna-storage", daemon=True)
    t.start()
    return t


def study_name(candidate_id: str) -> str:
    return f"kernellab-{candidate_id}"


@dataclass
class TuneResult:
    study: str
    seed: int
    trials: int  # finished trials of the study
    evaluated: int  # distinct configurations sent to the sandbox
    complete: int
    failed: int
    pruned: int
    best_config: dict | None  # the best correct config after full re-timing (``best_key``); None if none held
    best_ms: float | None
    best_speedup: float | None  # of the retime evaluation, under speedup_eager (None when interpreted)
    retimed: list[dict] = field(default_factory=list)  # {config, status, median_ms} per re-timed config

    def to_dict(self) -> dict:
        return asdict(self)


def make_sampler(seed: int, n_startup_trials: int = 8, parallel: int = 1) -> Any:
    """TPE as every kernellab study uses it (and ``experiments/bench_tuning.py`` measures it):
    multivariate, because tile sizes interact (a BLOCK_K that fits with BLOCK_M=64 may not with 256);
    a constant liar when several trials are in flight, so they are not proposed the same config."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials, multivariate=True,
                                          constant_liar=parallel > 1)


def tune(problem: Any, candidate: dict, *, store: Any, executor: Any = None, n_trials: int = 20, seed: int = 0,
         small: bool | None = None, device: str | None = None, parallel: int | None = None, trials: int = 2,
         retime_top: int = 3, early_stop: float = 3.0, n_startup_trials: int = 8, deadline: float | None = None,
         objective: str = DEFAULT_OBJECTIVE) -> dict:
    """Tune ``candidate`` (a store row) with TPE over ``n_trials`` distinct configurations; returns
    ``TuneResult.to_dict()``. ``trials`` is the number of correctness trials per configuration
    (re-timing uses the sandbox's default of 5). Deterministic for a seed when one job runs at a time.
    ``deadline`` (a ``time.monotonic()`` value, the campaign's time budget): no trial starts after it, and
    only the best configuration is re-timed once it has passed. The re-timed configurations are ranked as
    the store ranks a campaign's evaluations (``best_key(objective)``: the objective's speedup, then the
    median): the tuning's best is the row ``store.best`` would select among them."""
    import optuna

    check_objective(objective)
    if n_trials < 1:
        raise ValueError(f"n_trials must be >= 1, got {n_trials}")
    dists, config, nested = _space_of(candidate)
    runner = _Runner(problem, candidate["source"], executor=executor, small=small, device=device, trials=trials,
                     store=store, nested=nested)
    parallel = max(1, parallel or runner.workers)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = make_sampler(seed, n_startup_trials=n_startup_trials, parallel=parallel)
    study = optuna.create_study(study_name=study_name(candidate["id"]), storage=optuna_storage(store),
                                sampler=sampler, direction="minimize", load_if_exists=True)
    if not study.trials:
        _describe(study, seed, candidate, problem)
        if config:
            study.enqueue_trial({k: v for k, v in config.items() if k in dists})
    _fail_stale(study)
    seen: dict[str, tuple[str, float | None, Any]] = {}  # config -> (state, value, trial number)
    for t in study.trials:  # a resumed study: earlier outcomes stand
        if t.state.is_finished() and STALE not in t.user_attrs:
            seen.setdefault(canonical_json(t.params), (t.state.name, _value_of(t), t.number))
    evaluated = _search(study, dists, config, seen, runner, candidate_id=candidate["id"], store=store,
                        n_trials=n_trials, parallel=parallel, seed=seed, early_stop=early_stop, nested=nested,
                        deadline=deadline)
    late = deadline is not None and time.monotonic() >= deadline
    retimed, best = _retime_best(study, config, seen, runner, candidate_id=candidate["id"], store=store,
                                 retime_top=min(retime_top, 1) if late else retime_top, nested=nested,
                                 objective=objective)
    states = [t.state.name for t in study.get_trials(deepcopy=False)]
    return TuneResult(study=study.study_name, seed=study.user_attrs.get("seed", seed), trials=len(states),
                      evaluated=evaluated, complete=states.count("COMPLETE"), failed=states.count("FAIL"),
                      pruned=states.count("PRUNED"), best_config=best["config"] if best else None,
                      best_ms=best["median_ms"] if best else None,
                      best_speedup=best.get("speedup_eager") if best else None, retimed=retimed).to_dict()


def _space_of(candidate: dict) -> tuple[dict, dict, bool]:
    """(Optuna distributions, the candidate's flat CONFIG, whether its SPACE is per kernel)."""
    space, config = read_space(candidate["source"])
    if space is None:
        space = candidate.get("space")  # JSON: every list is a choice list (ranges need the source literal)
    if space is None:
        raise SpaceError(f"candidate {candidate['id']} has no SPACE to tune")
    nested = is_nested(space)
    space, config = flatten_space(space, config)
    dists = parse_space(space, config)
    return dists, dict(config or {}), nested


def _describe(study: Any, seed: int, candidate: dict, problem: Any) -> None:
    """A new study's user attributes: what optuna-dashboard shows about it."""
    study.set_user_attr("seed", seed)
    study.set_user_attr("sampler", "TPESampler(multivariate=True)")
    study.set_user_attr("candidate_id", candidate["id"])
    study.set_user_attr("campaign_id", candidate.get("campaign_id"))
    study.set_user_attr("problem", getattr(problem, "name", None))
    study.set_user_attr("value", "median_ms of a quick sandbox timing")


def _search(study: Any, dists: dict, config: dict, seen: dict, runner: _Runner, *, candidate_id: str, store: Any,
            n_trials: int, parallel: int, seed: int, early_stop: float, nested: bool,
            deadline: float | None = None) -> int:
    """Ask, evaluate and tell until ``n_trials`` distinct configurations are known (``seen``, updated in
    place) or ``deadline`` passes; returns how many this call evaluated."""
    size = space_size(dists)
    evaluated = 0

    def best_ms() -> float | None:
        values = [v for s, v, _ in seen.values() if s == "COMPLETE" and v is not None]
        return min(values) if values else None

    in_flight: dict[Future, Any] = {}
    asks = 0
    while True:
        # n_trials counts distinct configurations evaluated (a resumed study counts its earlier ones)
        while (len(seen) < min(n_trials, size or n_trials) and len(in_flight) < parallel and asks < 20 * n_trials
               and (deadline is None or time.monotonic() < deadline)):
            asks += 1
            trial = study.ask(dists)
            key = canonical_json(trial.params)
            if key in seen:  # proposed again: tell the first outcome, evaluate nothing
                _tell_duplicate(study, trial, seen[key], dists, seen, random.Random(f"{seed}:{len(seen)}:{asks}"))
                continue
            seen[key] = ("RUNNING", None, trial.number)
            limit = best_ms()
            in_flight[runner.submit({**config, **trial.params}, True,
                                    early_stop * limit if limit is not None else None)] = trial
            evaluated += 1
        if not in_flight:
            return evaluated
        done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
        for fut in done:
            trial = in_flight.pop(fut)
            result = _result_of(fut, unflatten({**config, **trial.params}, nested))
            store.add_evaluation(candidate_id, result, kind=Kind.TRIAL)
            state, value = _judge(trial, result)
            seen[canonical_json(trial.params)] = (state, value, trial.number)
            _tell(study, trial, state, value)


def _tell_duplicate(study: Any, trial: Any, first: tuple[str, float | None, Any], dists: dict, seen: dict,
                    rng: random.Random) -> None:
    state, value, number = first
    trial.set_user_attr("duplicate_of", number)
    if state == "RUNNING":  # its first outcome is not known yet
        trial.set_user_attr("reason", f"duplicate of trial {number}, still running")
        state = "FAIL"
    _tell(study, trial, state, value)
    # TPE converged on known ground: the next trial is a random configuration not yet seen
    fresh = _unseen(dists, seen, rng)
    if fresh is not None:
        study.enqueue_trial(fresh, user_attrs={"origin": "random, after a duplicate proposal"})


def _retime_best(study: Any, config: dict, seen: dict, runner: _Runner, *, candidate_id: str, store: Any,
                 retime_top: int, nested: bool, objective: str = DEFAULT_OBJECTIVE) -> tuple[list[dict], dict | None]:
    """The best few, re-timed with full timing and full correctness checks: (what each re-timing gave,
    the best correct one under ``best_key(objective)``)."""
    ranked = sorted((v, n) for s, v, n in seen.values() if s == "COMPLETE" and v is not None)
    configs = [{**config, **study.trials[n].params} for _, n in ranked[:retime_top]]
    retimes: list[dict | None] = [_retimed_before(study, store, c) for c in configs]
    futures = {runner.submit(c, False): i for i, c in enumerate(configs) if retimes[i] is None}
    # each saved as it ends (and named on the study), so a tuning stopped here re-times only what was in flight
    for fut in as_completed(futures):
        i = futures[fut]
        r = retimes[i] = _result_of(fut, unflatten(configs[i], nested))
        eid = store.add_evaluation(candidate_id, r, kind=Kind.RETIME)
        study.set_user_attr(_RETIMED + canonical_json(configs[i]), eid)
    retimes = [r for r in retimes if r is not None]
    retimed = [{"config": r["config"], "status": r["status"], "median_ms": r.get("median_ms")} for r in retimes]
    best = best_retime(retimes, objective)
    if best is not None:
        study.set_user_attr("best_config", best["config"])
        study.set_user_attr("best_ms", best["median_ms"])
    return retimed, best


_RETIMED = "retimed:"  # a study's user attribute: the evaluation that re-timed the configuration after it


def _retimed_before(study: Any, store: Any, config: dict) -> dict | None:
    """The re-timing an earlier run of this tuning saved for ``config`` (a tuning resumed after a stop), or None."""
    eid = study.user_attrs.get(_RETIMED + canonical_json(config))
    return store.get_evaluation(eid) if eid else None


def best_retime(retimes: list[dict], objective: str = DEFAULT_OBJECTIVE) -> dict | None:
    """The correct, timed re-timing ``best_key(objective)`` ranks first. Not the lowest median: each
    re-timing times eager in its own job, and on the H200 the config with the lowest median (BLOCK 512)
    had the lower speedup over eager, so the tuning named a best that ``store.best`` did not select."""
    good = [r for r in retimes if r.get("status") == "correct" and r.get("median_ms")]
    return min(good, key=best_key(objective), default=None)


STALE = "stale"  # user attribute of a trial a killed tuning left RUNNING


def _fail_stale(study: Any) -> list[int]:
    """Mark FAIL the trials a killed tuning left RUNNING, and enqueue their configurations again.

    One tuning of a candidate runs at a time (the campaign lock holds its campaign), so a RUNNING
    trial met when the study is opened has no one left to tell it. Left RUNNING, it would stay so in
    the dashboard and count in no state; its configuration was never measured, so it is not an
    outcome: the trial is FAIL with ``user_attrs["stale"]`` and the configuration is asked again."""
    from optuna.trial import TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    finished = {canonical_json(t.params) for t in study.get_trials(deepcopy=False)
                if t.state.is_finished() and STALE not in t.user_attrs}
    waiting = {canonical_json(t.params) for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
    for t in stale:
        study._storage.set_trial_user_attr(t._trial_id, STALE, "left RUNNING by a tuning that was killed")
        study.tell(t.number, state=TrialState.FAIL)
        key = canonical_json(t.params)
        if t.params and key not in finished and key not in waiting:
            study.enqueue_trial(t.params, user_attrs={"origin": f"again, after stale trial {t.number}"})
            waiting.add(key)
    return [t.number for t in stale]


def _unseen(dists: dict[str, Any], seen: dict[str, Any], rng: random.Random, tries: int = 200) -> dict | None:
    for _ in range(tries):
        params = {}
        for name, d in dists.items():
            if hasattr(d, "choices"):
                params[name] = rng.choice(d.choices)
            elif type(d).__name__ == "IntDistribution":
                params[name] = d.low + d.step * rng.randint(0, (d.high - d.low) // d.step)
            else:
                params[name] = rng.uniform(d.low, d.high)
        if canonical_json(params) not in seen:
            return params
    return None


def _value_of(trial: Any) -> float | None:
    if trial.value is not None:
        return trial.value
    steps = trial.intermediate_values
    return steps[max(steps)] if steps else None


def _result_of(fut: Future, cfg: dict) -> dict:
    try:
        result = dict(fut.result())
    except Exception as exc:  # the executor itself failed on this job: the trial fails, the study goes on
        result = {"status": "crash", "error_text": f"{type(exc).__name__}: {exc}", "error_class": type(exc).__name__}
    result["config"] = cfg
    return result


def _judge(trial: Any, result: dict) -> tuple[str, float | None]:
    """Optuna state and value of one trial's sandbox result, with the reason on the trial."""
    ms = result.get("median_ms")
    trial.set_user_attr("status", result.get("status"))
    if result.get("status") != "correct" or ms is None or not math.isfinite(ms):
        reason = result.get("error_class") or result.get("status") or "no timing"
        text = (result.get("error_text") or "").strip().splitlines()
        trial.set_user_attr("reason", f"{reason}: {text[-1][:300]}" if text else reason)
        return "FAIL", None
    if (result.get("details") or {}).get("early_stopped"):
        trial.set_user_attr("reason", "early stop: first repetitions above the limit")
        return "PRUNED", float(ms)
    return "COMPLETE", float(ms)


def _tell(study: Any, trial: Any, state: str, value: float | None) -> None:
    from optuna.trial import TrialState

    if state == "COMPLETE":
        study.tell(trial, value)
    elif state == "PRUNED":
        if value is not None:
            trial.report(value, 0)  # TPE ranks a pruned trial by its last intermediate value
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)


class _Runner:
    """Submits sandbox jobs for the candidate under a config. Trials ask the sandbox for its cheaper
    timing and for an early stop above ``stop_above_ms`` through ``EvalJob`` fields, where the
    sandbox has them (``timing_target_ms``, ``stop_above_ms``); without them a trial is timed fully."""

    QUICK_TARGET_MS = 50.0  # timed work per trial on the GPU (the sandbox's full timing aims at 300 ms)

    def __init__(self, problem: Any, source: str, *, executor: Any, small: bool | None, device: str | None,
                 trials: int, store: Any = None, nested: bool = False):
        from kernellab import sandbox

        self.nested = nested
        self.sandbox = sandbox
        self.executor = executor or sandbox.default_executor()
        self.problem, self.source, self.store = problem, source, store
        self.small, self.device, self.trials = small, device, trials
        self.fields = set(getattr(sandbox.EvalJob, "__dataclass_fields__", {}))
        from kernellab.env import has_cuda

        kind = device or ("cuda" if has_cuda() else "cpu")
        self.workers = max(1, int(self.executor.slots(kind) or 1))

    def submit(self, config: dict, quick: bool, stop_above_ms: float | None = None) -> Future:
        extra: dict[str, Any] = {}
        if quick and "timing_target_ms" in self.fields:
            extra["timing_target_ms"] = self.QUICK_TARGET_MS
        if quick and stop_above_ms is not None and "stop_above_ms" in self.fields:
            extra["stop_above_ms"] = stop_above_ms
        job = self.sandbox.EvalJob(self.problem, self.source, config=unflatten(config, self.nested), small=self.small, device=self.device,
                                   trials=self.trials if quick else 5, store=self.store, **extra)
        return self.executor.submit(job)
