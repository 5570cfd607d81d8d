"""``kernellab bench SUITE``: one campaign per problem of a suite, then one honest table.

fast_p (KernelBench's measure) is the fraction of **all** problems of the suite whose best *kernel win* is
faster than the baseline by more than p; we report it against eager and against ``torch.compile``, both timed
in the same run on the same device. A kernel win (the design contract) is a correct candidate that runs at least
``KERNEL_SHARE_MIN`` of its GPU time in its own kernels; a problem's winner is the best of those (a faster
candidate that is mostly cuDNN or cuBLAS does not hide it), re-timed in a fresh job like every winner. A problem
whose correct candidates are all ``library_only`` or below that share is reported separately and not counted
unless ``allow_library`` (then the best correct candidate of any kind is its winner).
Problems not finished (not run yet, interrupted, or in another shard) count as not correct and not
fast: the denominators are always the whole suite. Interpreted (CPU) runs check correctness only:
their speedups are None and fast_p>0 is not computed.

Incremental: every bench campaign records ``config["bench"]["config_hash"]``, the hash of the settings
that affect results (``bench_config``). A rerun into the same database skips problems whose campaign
under that hash is ``done``, resumes unfinished ones from their LangGraph checkpoint (a killed
campaign repeats none of its finished evaluations), and starts the rest. ``--shard I/N`` runs the
problems whose index in the suite sorted by path is I mod N; ``bench_summary`` reads several
databases (one per shard) into one table.
"""

from __future__ import annotations

import datetime as _dt
import glob
import hashlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kernellab import _interrupt, _runtime, env
from kernellab._busy import BusySampler
from kernellab.campaign import (
    CampaignConfig,
    check_campaign,
    mark_stopped,
    retimes_missing,
    run_campaign,
    start_campaign,
)
from kernellab.fileio import write_atomic
from kernellab.problem import Problem, load_problem, validate
from kernellab.vocab import KERNEL_WIN_SHARE, Kind, Status, best_key, counts_as_kernel_win, small_for

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
THRESHOLDS = (0.0, 1.0, 1.5, 2.0)
KERNEL_SHARE_MIN = KERNEL_WIN_SHARE  # the sandbox's: a kernel win runs at least half its GPU time in its own kernels


class BenchError(ValueError):
    """Bad bench input (a suite that does not exist, a malformed --shard): one line, exit 2."""


def suite_paths(suite: str) -> list[Path]:
    """A suite is a name under experiments/suites/ (``full``), a suite file (one path a line, relative
    to the repository root or to the file), a folder of problems, a glob (``level1/1*_*.py``), or one
    problem file (``.py``: a suite of one, not a list of the lines of its source)."""
    p = Path(suite)
    if p.suffix == ".py" and p.is_file():
        return [p]
    candidates = [p, ROOT / "experiments" / "suites" / f"{suite}.txt", ROOT / "experiments" / "suites" / suite]
    for c in candidates:
        if c.is_dir():
            return sorted(x for x in c.rglob("*.py") if not x.name.startswith("_"))
        if c.is_file():
            out = []
            for line in c.read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    q = Path(line)
                    if not q.is_absolute():
                        q = ROOT / q if (ROOT / q).is_file() or not (c.parent / q).is_file() else c.parent / q
                    out.append(q)
            missing = [str(q) for q in out if not q.is_file()]
            if missing:
                raise FileNotFoundError(f"{c}: lists missing problem files: {', '.join(missing)}")
            return out
    if glob.has_magic(suite):
        hits = sorted(Path(x) for x in glob.glob(suite, recursive=True) if x.endswith(".py"))
        if not hits and not p.is_absolute():
            hits = sorted(Path(x) for x in glob.glob(str(ROOT / suite), recursive=True) if x.endswith(".py"))
        if hits:
            return hits
        raise FileNotFoundError(f"suite glob {suite!r} matches no .py file")
    raise FileNotFoundError(f"no suite {suite!r} (a name in experiments/suites/, a suite file, a folder or a glob)")


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"I/N"`` (0 <= I < N) -> (I, N); None -> None."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise BenchError(f"--shard {text!r}: expected I/N with 0 <= I < N (e.g. 0/4 ... 3/4)")
    return int(m.group(1)), int(m.group(2))


def shard_indices(paths: Sequence[Path], shard: tuple[int, int] | None) -> list[int]:
    """Indices (into ``paths``) of the problems shard I/N runs: those whose rank in the suite sorted by
    path is I mod N. Paths are compared relative to their common folder, so two hosts with the
    repository in different places split a suite alike."""
    if shard is None:
        return list(range(len(paths)))
    i, n = shard
    resolved = [Path(os.path.abspath(p)) for p in paths]
    base = Path(os.path.commonpath([str(p.parent) for p in resolved])) if resolved else Path("/")
    keys = [p.relative_to(base).as_posix() for p in resolved]
    order = sorted(range(len(paths)), key=lambda k: (keys[k], k))
    return sorted(k for rank, k in enumerate(order) if rank % n == i)


def bench_config(config_kw: dict) -> dict:
    """The settings that affect a problem's result, with ``device``, ``small`` and ``tune_trials``
    resolved as the campaign resolves them (None = cuda when available; SMALL sizes on the CPU only;
    ``CampaignConfig.tune_trials_on``)."""
    cfg = asdict(CampaignConfig(problems=[], **config_kw))
    cfg.pop("problems")
    # reuse records what another campaign measured under the same conditions: the results do not
    # change with it, so neither does the hash (a bench database from before the option still matches)
    cfg.pop("reuse")
    device = cfg["device"] or env.default_device()
    cfg["device"] = "cuda" if device.startswith("cuda") else device
    cfg["small"] = small_for(cfg["device"], cfg["small"])
    # resolved too: a CPU bench keeps its earlier hash (0, no tuning), a GPU one names its trials
    cfg["tune_trials"] = CampaignConfig(problems=[], **config_kw).tune_trials_on(cfg["device"])
    return cfg


def config_hash(cfg: dict) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


def bench_campaigns(store: Any, chash: str) -> dict[str, list[dict]]:
    """problem id -> the bench campaigns run under ``chash``, oldest first."""
    out: dict[str, list[dict]] = {}
    for camp in store.list_campaigns():
        b = (camp.get("config") or {}).get("bench") or {}
        if b.get("config_hash") == chash and camp["config"].get("problem_ids"):
            out.setdefault(camp["config"]["problem_ids"][0], []).append(camp)
    return out


def _pick(evals: list[dict], objective: str) -> dict | None:
    return min(evals, key=best_key(objective), default=None)


def problem_row(store: Any, campaign_id: str, objective: str = "speedup_eager", allow_library: bool = False) -> dict:
    camp = store.get_campaign(campaign_id)
    pid = camp["config"]["problem_ids"][0]
    prob = store.get_problem(pid)
    full = store.evaluations(campaign_id=campaign_id, kind=Kind.FULL)
    failures: dict[str, int] = {}
    for e in full:
        if e["status"] != Status.CORRECT:
            key = e["error_class"] or e["status"]
            failures[key] = failures.get(key, 0) + 1
    cands = store.candidates(campaign_id, pid)
    # the store's reported best among the kernel wins (every correct one with allow_library), replaced by its
    # fresh-job re-timing: a faster candidate that is mostly cuDNN does not hide a correct one of our own
    reported = store.reported_best(campaign_id, pid, objective, library=allow_library, kernel=not allow_library)
    best = reported[0] if reported and counts_as_kernel_win(reported[0], allow_library) else None
    good = store.reported_best(campaign_id, pid, objective, library=True) if best is None else [best]
    row: dict[str, Any] = {"problem": prob["name"], "path": prob["path"], "problem_id": pid, "campaign": camp["name"],
                           "device": camp["device"], "finished": camp["status"] == "done", "state": camp["status"],
                           "candidates": len(cands), "evaluations": len(full), "failures": failures,
                           "correct": best is not None, "not_counted": None}
    if _rerun_of(camp):
        row["rerun_of"] = _rerun_of(camp)
    if best is None:
        other = _pick(good, objective)
        if other is not None:  # correct, but not a kernel win: reported, never counted in fast_p
            row["not_counted"] = {
                "reason": "library_only" if other["library_only"] else "low_share",
                "own_kernel_share": other["own_kernel_share"], "candidate_id": other["candidate_id"],
                "interpreted": bool(other["interpreted"]),
                "speedup_eager": other["speedup_eager"], "speedup_compile": other["speedup_compile"]}
        return row
    order = [e["id"] for e in store.evaluations(campaign_id=campaign_id)]
    t0 = _dt.datetime.fromisoformat(camp["created_at"])
    lineage = store.lineage(best["candidate_id"])
    analyses = [ev["payload"] for ev in store.events(campaign_id, "analyze")
                if ev["payload"].get("candidate_id") == best["candidate_id"]]
    row.update({
        "candidate_id": best["candidate_id"], "config": best["config"], "interpreted": bool(best["interpreted"]),
        "median_ms": best["median_ms"], "p20_ms": best["p20_ms"], "p80_ms": best["p80_ms"],
        "eager_ms": best["eager_ms"], "compile_ms": best["compile_ms"],
        "speedup_eager": best["speedup_eager"], "speedup_compile": best["speedup_compile"],
        "speedup_eager_p20_p80": best["speedup_eager_p20_p80"],
        "speedup_compile_p20_p80": best["speedup_compile_p20_p80"],
        "own_kernel_share": best["own_kernel_share"], "retimed": bool(best.get("retimed")),
        "win_eager": best.get("win_eager"), "win_compile": best.get("win_compile"),
        "evaluations_to_best": order.index(best["selected_id"]) + 1 if best.get("selected_id") in order else None,
        "seconds_to_best": round((_dt.datetime.fromisoformat(best["created_at"]) - t0).total_seconds(), 1),
        "actions": [c["action"] or "(seed)" for c in lineage],
        "analysis": analyses[-1] if analyses else None,
    })
    return row


def pending_row(problem: Problem, path: Path, state: str, campaign: str | None = None) -> dict:
    """A problem with no finished campaign: it counts as not correct and not fast."""
    return {"problem": problem.name, "path": str(path), "problem_id": problem.id, "campaign": campaign,
            "finished": False, "state": state, "candidates": 0, "evaluations": 0, "failures": {},
            "correct": False, "not_counted": None}


def summarize(rows: list[dict]) -> dict:
    """Over ``rows``, one per problem of the WHOLE suite: a row that is not ``finished`` (absent key =
    finished) counts as not correct and not fast, and only kernel wins (``correct``) count in fast_p."""
    n = len(rows)
    done = [r for r in rows if r.get("finished", True)]
    wins = [r for r in done if r["correct"]]
    win_ids = {id(r) for r in wins}
    out: dict[str, Any] = {"problems": n, "finished": len(done), "correct": len(wins),
                           "not_counted": sum(1 for r in done if not r["correct"] and r.get("not_counted"))}
    interpreted = any(r.get("interpreted") for r in done)
    out["interpreted"] = interpreted
    for base in ("eager", "compile"):
        key = f"speedup_{base}"
        # a baseline no row timed (torch.compile on the CPU) has no fast_p, fast_0 included: under its column
        # a 1.00 read as a comparison that never took place
        timed = any(r.get(key) is not None or r.get(f"{base}_ms") is not None for r in wins)
        for p in THRESHOLDS:
            name = f"fast_{p:g}_{base}"
            if (interpreted and p > 0) or (wins and not timed):
                out[name] = None
                continue
            # from 1x up, a win also needs its re-timed p20-p80 band to clear the baseline's (win_*
            # False); a row never re-timed (None) is judged on its median alone
            out[name] = sum(1 for r in wins if p == 0 or ((r.get(key) or 0) > p and
                                                         (p < 1 or r.get(f"win_{base}") is not False))) / n if n else None
        vals = [r[key] for r in wins if r.get(key)]
        out[f"geomean_{base}_correct"] = math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None
        # counting an incorrect or unfinished problem as 1.0x (we fall back to the reference) keeps the mean honest
        all_vals = [r.get(key) if id(r) in win_ids and r.get(key) else 1.0 for r in rows]
        out[f"geomean_{base}_all"] = math.exp(sum(map(math.log, all_vals)) / n) if n and not interpreted else None
    fails: dict[str, int] = {}
    for r in done:
        for k, v in r["failures"].items():
            fails[k] = fails.get(k, 0) + v
    out["failures"] = fails
    return out


class _Rows:
    """The rows of a suite read from one or more stores (rows of finished campaigns are cached: they
    no longer change)."""

    def __init__(self, stores: Sequence[Any], problems: list[Problem], paths: list[Path], chash: str,
                 objective: str, allow_library: bool):
        self.stores, self.problems, self.paths, self.chash = list(stores), problems, paths, chash
        self.objective, self.allow_library = objective, allow_library
        self._cache: dict[tuple[int, str], dict] = {}

    def campaigns(self, pid: str, index: list[dict] | None = None) -> list[tuple[int, dict]]:
        """(store index, campaign) of problem ``pid``, the one that counts last: the latest finished
        campaign, else the latest unfinished one."""
        index = index if index is not None else [bench_campaigns(s, self.chash) for s in self.stores]
        out = [(k, c) for k, ix in enumerate(index) for c in ix.get(pid, [])]
        return sorted(out, key=lambda kc: (kc[1]["status"] == "done", kc[1]["updated_at"] or ""))

    def all(self) -> list[dict]:
        index = [bench_campaigns(s, self.chash) for s in self.stores]
        rows = []
        for prob, path in zip(self.problems, self.paths, strict=True):
            found = self.campaigns(prob.id, index)
            if not found:
                rows.append(pending_row(prob, path, "not run"))
                continue
            k, camp = found[-1]
            key = (k, camp["id"], camp["updated_at"])  # a finished campaign run again for its re-timings changes
            if key in self._cache:
                rows.append(self._cache[key])
                continue
            row = problem_row(self.stores[k], camp["id"], self.objective, self.allow_library)
            if camp["status"] == "done":
                self._cache[key] = row
            else:  # why it stopped, if the bench recorded it (a finished campaign's old error is history)
                errors = [e["payload"]["error"] for e in self.stores[k].events(camp["id"], "error")]
                if errors:
                    row["campaign_error"] = errors[-1]
            rows.append(row)
        return rows


def _result(suite: str, rows: list[dict], *, date: str, device: str, cfg: dict, chash: str, allow_library: bool,
            shard: tuple[int, int] | None, dbs: list[str]) -> dict:
    devices = sorted({r["device"] for r in rows if r.get("finished") and r.get("device")})
    summary = summarize(rows)
    return {"suite": suite, "date": date, "device": device, "devices_of_results": devices,
            "versions": env.versions(), "config": cfg, "config_hash": chash, "allow_library": allow_library,
            "kernel_share_min": KERNEL_SHARE_MIN, "shard": f"{shard[0]}/{shard[1]}" if shard else None,
            "databases": dbs, "problems_total": len(rows), "problems_finished": summary["finished"],
            "complete": summary["finished"] == len(rows), "summary": summary, "problems": rows}


def _stem(date: _dt.datetime, device_name: str, label: str, shard: tuple[int, int] | None) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")[:24]
    return f"{date.strftime('%Y-%m-%d')}-{slug}-{label}" + (f"-shard{shard[0]}of{shard[1]}" if shard else "")


def _write(result: dict, jpath: Path, mpath: Path) -> None:
    write_atomic(jpath, json.dumps(result, indent=2, default=str))
    write_atomic(mpath, to_markdown(result))


def run_bench(suite: str, store: Any, config_kw: dict, name: str | None = None, allow_library: bool = False,
              out_dir: Path = RESULTS, progress: Any = None, jobs: int = 1, shard: tuple[int, int] | None = None,
              log: Callable[[str], None] | None = None, extra: dict | None = None,
              tag: dict | None = None, executor_factory: Callable[[], Any] | None = None,
              rerun: Sequence[str] = ()) -> tuple[dict, Path, Path]:
    """Run the suite's problems (this shard's) that have no finished campaign under this configuration:
    skip the finished, resume the unfinished, start the rest. ``jobs`` campaigns run at once (threads
    sharing one sandbox executor): loading, compiling and checking overlap while the executor still
    allows one timing per GPU at a time. The result files (scored over the whole suite) are rewritten
    atomically after every finished problem, so an interrupted bench keeps what it measured.
    ``extra``: settings outside CampaignConfig that change results (a study's prompt hash), hashed with
    it; ``tag``: keys merged into each new campaign's config (a study's name and cell).
    ``executor_factory``: makes the executor (e.g. a ``DaskExecutor`` for ``--cluster``), called only when
    there is work; the bench shuts it down. Default: a ``LocalExecutor`` on this host. ``rerun``: problems (names
    or file stems) run again under the current code although finished, once (the rerun then counts)."""
    _runtime.setup()  # before the campaign threads start (they parse sources): kernellab._runtime
    from concurrent.futures import ThreadPoolExecutor

    from kernellab import sandbox

    paths = suite_paths(suite)
    # read and checked without running: a finished problem is scored from the database, and running all 170 of
    # KernelBench's references at small sizes took 15-25 s of every suite call before its first problem started
    problems = [load_problem(p, validate_run=False) for p in paths]
    mine = shard_indices(paths, shard)
    CampaignConfig(problems=[str(p) for p in paths], **config_kw).validate()
    cfg = {**bench_config(config_kw), **(extra or {})}
    chash = config_hash(cfg)
    stamp = _dt.datetime.now(_dt.timezone.utc)
    device = config_kw.get("device") or env.default_device()
    here = env.device_name(device)
    stem = _stem(stamp, here, name or Path(suite).stem, shard)
    jpath, mpath = Path(out_dir) / f"{stem}.json", Path(out_dir) / f"{stem}.md"
    reader = _Rows([store], problems, paths, chash, cfg["objective"], allow_library)
    lock = threading.Lock()
    say = log or (lambda msg: None)

    ids_of = {key: prob.id for prob, path in zip(problems, paths, strict=True) for key in (prob.name, path.stem)}
    unknown = [x for x in rerun if x not in ids_of]
    if unknown:
        raise BenchError(f"--rerun {unknown[0]}: not a problem of {suite}")
    todo, skipped, resumed, again = _plan(reader, problems, mine, frozenset(ids_of[x] for x in rerun))
    for i, _ in todo:  # all-or-nothing: a file with work to do that does not run stops the bench before any work
        validate(problems[i], run=True)
    if todo:  # options, policy and LLM backend checked once, before anything is written
        # the suite's scores and each campaign's winner compare timings of one device
        index = bench_campaigns(store, chash)
        others = sorted({c["device"] for p in problems for c in index.get(p.id, [])
                         if not env.timings_compare(c["device"], here)})
        if others:
            raise BenchError(f"{store.path} holds this configuration's results from {', '.join(others)} and this "
                             f"host's device is {here}: bench into another database, or on that device")
        check_campaign(CampaignConfig(problems=[str(paths[todo[0][0]])], **config_kw), store=store)
    say(f"bench {suite}: {len(problems)} problems, {len(mine)} in this shard"
        f"{f' ({shard[0]}/{shard[1]})' if shard else ''}; {skipped} skipped as finished, {resumed} to resume, "
        f"{len(todo) - resumed} to start{f' ({len(again)} of them again)' if again else ''} (config {chash})")
    # The pool is sized to the host (LocalExecutor's default), not to --jobs: the campaigns' trials,
    # re-timings and evaluations share it, and memory admission keeps large problems within the card.
    make = executor_factory or sandbox.LocalExecutor
    executor = make() if todo else None  # before any file: a cluster that fails writes nothing
    # a signal's stop shuts it down (workers killed); the campaigns see the stop through the guard
    guarded = _interrupt.Guarded(executor) if executor is not None else None
    gpus = _gpus_used(device, executor_factory is not None)
    # the executor's probe files each sample under what the GPU was held for (LocalExecutor.gpu_state)
    pace = _Pace(store, gpus, sampler=BusySampler(devices=None if gpus else [],
                                                  probe=executor.gpu_state if executor is not None else None))
    ids = {cid for _, cid in todo if cid is not None}  # this call's campaigns: marked stopped on a stop
    pace.count_before(ids)

    counter = {"done": skipped, "retimed": 0}
    # finished before this call, run again for a missing re-timing alone: done here, but no problem of this call's pace
    retime_only = {cid for _, cid in todo if cid is not None and (store.get_campaign(cid) or {}).get("status") == "done"}

    def write() -> dict:
        with lock:
            result = _result(suite, reader.all(), date=stamp.isoformat(timespec="seconds"), device=here,
                             cfg=cfg, chash=chash, allow_library=allow_library, shard=shard, dbs=[str(store.path)])
            result["pace"] = pace.snapshot(counter["done"] - skipped - counter["retimed"], ids)
            _write(result, jpath, mpath)
            return result

    write()  # the files exist from the start and say how much of the suite is finished

    def one(i: int, resume: str | None) -> None:
        if guarded is not None and _interrupt.stopping(guarded.event):
            return
        prob = problems[i]
        if resume is None:
            resume = _start(store, suite, prob, paths[i], config_kw, chash, stamp, tag, again.get(i))
            with lock:
                ids.add(resume)
        # each campaign its own lines (the campaign names its problem as it starts)
        _run_one(store, resume, progress.fork(prob.name) if progress is not None else None, guarded)
        with lock:  # before the page is written: its pace counts this problem
            counter["done"] += 1
            counter["retimed"] += resume in retime_only
            n_done = counter["done"]
        result = write()
        verdict = _verdict(next(r for r in result["problems"] if r["problem_id"] == prob.id))
        say(f"bench: {n_done}/{len(mine)} done, {skipped} skipped as finished"
            f"{f', {resumed} resumed' if resumed else ''}: {prob.name} {verdict}")
        say(pace_line(result["pace"]))

    # the re-timings of finished problems first: short jobs, and a stop in the middle of one would show a finished
    # problem as stopped until the next call
    order = _Order(sorted(todo, key=lambda t: t[1] not in retime_only),
                   _large_rule(executor, problems, device, config_kw.get("small")), cap=max(1, jobs // 4))

    def next_one() -> None:
        i, resume, large = order.take()
        try:
            one(i, resume)
        finally:
            order.done(large)

    # not `with ThreadPoolExecutor`: its exit waits for every campaign to end, which held a Ctrl-C for minutes
    pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="kernellab-bench")
    futs: list = []
    with pace.sampler:
        try:
            futs += [pool.submit(next_one) for _ in todo]
            for fut in futs:
                fut.result()
        except BaseException:  # Ctrl-C, SIGTERM (the CLI's handler), or a bug: stop everything, save, go
            with _interrupt.deferred():
                _stop_bench(guarded, pool, futs, store, ids, lock, write, say)
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            if executor is not None:
                executor.shutdown(wait=not (guarded is not None and guarded.event.is_set()))
    result = write()
    say(f"bench: {counter['done']}/{len(mine)} done, {skipped} skipped as finished; "
        f"{result['problems_finished']} of {result['problems_total']} problems of the suite finished")
    say(pace_line(result["pace"]))
    return result, jpath, mpath


# a problem is large when one of its jobs asks for more than this share of its device's memory: a few such jobs
# fill the card (the share above which admission probes a problem alone first, ``sandbox._gpu.probes``)
LARGE_SHARE = 0.25


def _large_rule(executor: Any, problems: list[Problem], device: str, small: bool | None) -> Callable[[int], bool]:
    """problem index -> whether it is large (``LARGE_SHARE``), from the executor's ``memory_share`` (a pool that
    cannot tell, such as a cluster's, makes every problem count as small: the suite's order as it was)."""
    share = getattr(executor, "memory_share", None)

    def large(i: int) -> bool:
        if share is None:
            return False
        try:
            got = share(problems[i], small, device)
        except Exception:  # no estimate: admission runs its jobs alone and says why; here it takes its turn
            return False
        return got is not None and got > LARGE_SHARE

    return large


class _Order:
    """Which problem a free campaign thread takes next: the suite's order, except that at most ``cap`` large
    problems run at once while smaller ones wait. Memory admission lets only one or two jobs of KernelBench's
    6.4 GB elementwise problems share the H200, and eight such campaigns at once left it 12% busy for 305 s
    (session 18, one problem finished); smaller problems run beside a few large ones and use what they leave.
    When only large problems are left they go in order, cap or not: a thread never waits for a problem."""

    def __init__(self, todo: list[tuple[int, str | None]], large: Callable[[int], bool], cap: int) -> None:
        self._todo, self._large, self.cap = list(todo), large, cap
        self._known: dict[int, bool] = {}
        self._running = 0
        self._lock = threading.Lock()

    def take(self) -> tuple[int, str | None, bool]:
        with self._lock:
            k = 0
            if self._running >= self.cap:
                k = next((n for n, (i, _) in enumerate(self._todo) if not self._is_large(i)), 0)
            i, resume = self._todo.pop(k)
            big = self._is_large(i)
            self._running += big
            return i, resume, big

    def done(self, large: bool) -> None:
        with self._lock:
            self._running -= large

    def _is_large(self, i: int) -> bool:
        if i not in self._known:
            self._known[i] = bool(self._large(i))
        return self._known[i]


def _stop_bench(guarded: Any, pool: Any, futs: list, store: Any, ids: set[str], lock: Any, write: Callable[[], dict],
                say: Callable[[str], None]) -> None:
    """Stop a bench within seconds: give the stop (the campaigns' sandbox futures raise ``Stopped``, the
    workers are killed), start no queued campaign, give the campaign threads ``WAIT_S`` to mark their
    campaigns stopped, mark the rest (a thread busy where no stop reaches, e.g. an LLM call), save the page."""
    from concurrent.futures import wait

    t0 = time.monotonic()
    if guarded is not None:
        guarded.stop()
    pool.shutdown(wait=False, cancel_futures=True)
    # a queued campaign's future is cancelled now, but wait() counts it done only once a pool thread would have
    # picked it up: it waited out WAIT_S for 157 never-started campaigns and said they were "still busy"
    _, left = wait([f for f in futs if not f.cancelled()], timeout=_interrupt.WAIT_S)
    with lock:
        ids = set(ids)
    marked = mark_stopped(store, sorted(ids), "stopped by an interrupt (SIGINT or SIGTERM) before its thread ended")
    write()
    say(f"bench: stopped in {time.monotonic() - t0:.1f} s ({len(left)} campaign thread(s) still busy; "
        f"{len(marked)} campaign(s) marked stopped for them); the same command resumes the unfinished problems")


def _gpus_used(device: str, remote: bool) -> int | None:
    """GPUs a local bench evaluates on (those visible to its executor); 0 on the CPU; None for a cluster,
    whose GPUs are not this host's."""
    if remote:
        return None
    if not str(device).startswith("cuda"):
        return 0
    import torch

    return torch.cuda.device_count()


class _Pace:
    """A bench call's pace: wall time, problems finished by this call per hour, the evaluations this call
    made (reused copies left out: they cost no device time), per hour and per GPU-hour (wall hours x GPUs
    used), and the GPU busy share from the sampler (None without NVML)."""

    def __init__(self, store: Any, gpus: int | None, sampler: BusySampler):
        self.store, self.gpus, self.sampler = store, gpus, sampler
        self.t0 = time.monotonic()
        self.before: dict[str, int] = {}

    def _count(self, cid: str) -> int:
        return sum(1 for e in self.store.evaluations(campaign_id=cid)
                   if not (e.get("details") or {}).get("reused_from"))

    def count_before(self, ids: set[str]) -> None:
        """What the resumed campaigns had evaluated before this call."""
        self.before = {cid: self._count(cid) for cid in ids}

    def snapshot(self, problems_done: int, ids: set[str]) -> dict:
        wall = time.monotonic() - self.t0
        evals = sum(self._count(cid) - self.before.get(cid, 0) for cid in list(ids))
        hours = wall / 3600
        gpu_hours = hours * self.gpus if self.gpus else None
        busy = self.sampler.summary()
        return {"wall_s": round(wall, 1), "problems_done": problems_done,
                "problems_per_hour": round(problems_done / hours, 2) if hours > 0 else None,
                "evaluations": evals, "evaluations_per_hour": round(evals / hours, 1) if hours > 0 else None,
                "gpus": self.gpus, "gpu_hours": round(gpu_hours, 4) if gpu_hours else None,
                "evaluations_per_gpu_hour": round(evals / gpu_hours, 1) if gpu_hours else None,
                "gpu_busy_share": busy["busy_share"], "gpu_util_mean": busy["mean_util"],
                "gpu_samples": busy["samples"], "gpu_sampler": busy["error"],
                "host_cpu_busy": busy.get("host_cpu_busy"), "process_cpus": busy.get("process_cpus"),
                "gpu_states": busy.get("states")}


def pace_line(p: dict) -> str:
    """The pace as one line of the bench's output; the GPU's share only where NVML sampled it."""
    per = (f"{p['evaluations_per_gpu_hour']:.0f} per GPU-hour" if p.get("evaluations_per_gpu_hour") is not None
           else f"{p['evaluations_per_hour'] or 0:.0f} per hour")
    line = (f"bench: pace: {p['problems_done']} problems in {p['wall_s']:.0f} s "
            f"({p['problems_per_hour'] or 0:.1f} problems/hour), {p['evaluations']} evaluations ({per})")
    if p.get("gpu_busy_share") is not None:
        line += f", GPU busy {p['gpu_busy_share']:.0%} of the time (NVML utilization)"
    return line


def bench_summary(suite: str, stores: Sequence[Any], config_kw: dict, name: str | None = None,
                  allow_library: bool = False, out_dir: Path = RESULTS) -> tuple[dict, Path, Path]:
    """Score the suite from what ``stores`` hold (e.g. one database per shard) under the configuration
    ``config_kw`` describes, running nothing; writes the result files like ``run_bench``."""
    paths = suite_paths(suite)
    problems = [load_problem(p, validate_run=False) for p in paths]  # scored from the stores: nothing runs
    cfg = bench_config(config_kw)
    chash = config_hash(cfg)
    rows = _Rows(stores, problems, paths, chash, cfg["objective"], allow_library).all()
    stamp = _dt.datetime.now(_dt.timezone.utc)
    devices = sorted({r["device"] for r in rows if r.get("finished") and r.get("device")})
    device = ", ".join(devices) or f"none ({cfg['device']})"
    result = _result(suite, rows, date=stamp.isoformat(timespec="seconds"), device=device, cfg=cfg, chash=chash,
                     allow_library=allow_library, shard=None, dbs=[str(s.path) for s in stores])
    stem = _stem(stamp, devices[0] if devices else cfg["device"], (name or Path(suite).stem) + "-summary", None)
    jpath, mpath = Path(out_dir) / f"{stem}.json", Path(out_dir) / f"{stem}.md"
    _write(result, jpath, mpath)
    return result, jpath, mpath


def _rerun_of(camp: dict) -> str | None:
    return ((camp.get("config") or {}).get("bench") or {}).get("rerun_of")


def _plan(reader: _Rows, problems: list[Problem], mine: list[int], rerun: frozenset[str] = frozenset()
          ) -> tuple[list[tuple[int, str | None]], int, int, dict[int, str]]:
    """(problem index, campaign to resume or None to start) for each problem of the shard not finished
    under this configuration; how many are skipped as finished and how many resumed; and the problems
    (index -> the finished campaign it reruns) whose new campaign is a rerun (``rerun``: problem ids run
    again under the current code although finished, once: an unfinished rerun is resumed, a finished one counts).
    A finished campaign whose winners lack a re-timing (``campaign.retimes_missing``) is resumed for those alone."""
    todo: list[tuple[int, str | None]] = []
    skipped = resumed = 0
    again: dict[int, str] = {}
    for i in mine:
        camps = reader.campaigns(problems[i].id)
        if problems[i].id in rerun and camps and camps[-1][1]["status"] == "done":
            reruns = [kc for kc in camps if _rerun_of(kc[1])]
            if not reruns:
                again[i] = camps[-1][1]["id"]
                todo.append((i, None))
                continue
            camps = reruns
        if camps and camps[-1][1]["status"] == "done" and not retimes_missing(reader.stores[camps[-1][0]], camps[-1][1]):
            skipped += 1
        elif camps:
            resumed += 1
            todo.append((i, camps[-1][1]["id"]))
        else:
            todo.append((i, None))
    return todo, skipped, resumed, again


def _start(store: Any, suite: str, prob: Problem, path: Path, config_kw: dict, chash: str, stamp: _dt.datetime,
           tag: dict | None, rerun_of: str | None = None) -> str:
    """A new bench campaign for one problem, marked with the configuration's hash (and a study's tag, and the
    finished campaign it reruns)."""
    ccfg = CampaignConfig(problems=[str(path)], **config_kw)
    cid = start_campaign(store, ccfg, problems=[prob], name=f"bench-{Path(suite).stem}-{prob.name}-"
                                                            f"{chash[:8]}-{stamp.strftime('%Y%m%d-%H%M%S')}")
    camp = store.get_campaign(cid)
    store.update_campaign(cid, config={**camp["config"], **(tag or {}),
                                       "bench": {"config_hash": chash, "suite": suite}
                                       | ({"rerun_of": rerun_of} if rerun_of else {})})
    return cid


def _run_one(store: Any, campaign_id: str, progress: Any, executor: Any) -> None:
    try:
        run_campaign(store, campaign_id, progress=progress, executor=executor)
    except Exception as exc:  # one broken campaign is a row that says so, not a lost bench
        store.add_event(campaign_id, "error", {"error": f"{type(exc).__name__}: {exc}"[:2000]})
        import traceback

        traceback.print_exc()


def _verdict(row: dict) -> str:
    if row["correct"]:
        return "correct"
    if not row["finished"]:
        return "not finished"
    return f"correct, not counted ({row['not_counted']['reason']})" if row["not_counted"] else "no correct candidate"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def to_markdown(result: dict) -> str:
    share = result.get("kernel_share_min", KERNEL_SHARE_MIN)
    lines = _md_header(result) + _md_pace(result) + _md_summary(result, share)
    lines += ["## Problems", "",
              "| problem | correct | best ms (p20–p80) | eager ms | compile ms | vs eager | vs compile | evals to best | s to best | winning actions |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_md_problem(r, share) for r in result["problems"]]
    again = [r["problem"] for r in result["problems"] if r.get("rerun_of")]
    if again:  # their earlier finished campaign stays in the database, and no longer counts
        lines += ["", f"Run again under newer code (`--rerun`), the rerun counted: {', '.join(again)}."]
    losers = [r for r in result["problems"] if r.get("finished", True) and r["correct"] and r.get("speedup_compile") is not None and r["speedup_compile"] < 1.0]
    if losers:
        lines += ["", "## Where we lose to torch.compile", ""]
        for r in losers:
            a = r.get("analysis") or {}
            lines.append(f"- **{r['problem']}** ({_x(r['speedup_compile'])}): bound {a.get('bound', '?')}, "
                         f"{a.get('pct_of_ceiling') if a.get('pct_of_ceiling') is not None else '?'}% of ceiling. "
                         f"{a.get('evidence', 'no analysis recorded')}")
    return "\n".join(lines) + "\n"


def _md_header(result: dict) -> list[str]:
    """Title, environment, configuration and the warnings that qualify every number below."""
    s = result["summary"]
    v = result["versions"]
    lines = [f"# kernellab bench `{result['suite']}` — {result['date']}", "",
             f"Device: {result['device']}; torch {v.get('torch')}, triton {v.get('triton')}, cuda {v.get('cuda')}, "
             f"driver {v.get('driver')}, cupy {v.get('cupy')}, kernellab {v.get('kernellab')} (commit {v.get('commit')}).",
             f"Config: {json.dumps(result['config'], sort_keys=True)}"
             + (f" (hash {result['config_hash']})" if result.get("config_hash") else ""), ""]
    if len(result.get("devices_of_results") or []) > 1:
        lines += [f"**Results come from several devices: {', '.join(result['devices_of_results'])}.**", ""]
    if result.get("shard"):
        lines += [f"Shard {result['shard']} of the suite ran here; problems of other shards count as unfinished "
                  "unless this database holds them.", ""]
    if s["interpreted"]:
        lines += ["**Interpreted run (no CUDA device): correctness only, no speedup is claimed.**", ""]
    total = s["problems"]
    finished = s.get("finished", total)
    lines += [f"**{finished} of {total} problems finished.**"
              + ("" if finished == total else " Every fraction below is over all "
                 f"{total} problems: an unfinished problem counts as not correct and not fast."), ""]
    return lines


def _md_pace(result: dict) -> list[str]:
    """The call's pace (a page scored from databases, ``bench --summary-only``, ran nothing: no pace)."""
    p = result.get("pace")
    if not p:
        return []
    f = lambda v, fmt="{:.1f}": "-" if v is None else fmt.format(v)  # noqa: E731
    return ["## Pace of this call", "",
            "| wall s | problems done | problems/hour | evaluations | evaluations/GPU-hour | GPUs | GPU busy share | "
            "mean GPU utilization % |", "|---|---|---|---|---|---|---|---|",
            f"| {f(p['wall_s'])} | {p['problems_done']} | {f(p['problems_per_hour'])} | {p['evaluations']} | "
            f"{f(p['evaluations_per_gpu_hour'])} | {'-' if p['gpus'] is None else p['gpus']} | "
            f"{f(p['gpu_busy_share'], '{:.2f}')} | {f(p['gpu_util_mean'])} |", "", *md_states(p)]


def md_states(p: dict) -> list[str]:
    """Where the pace's time went (``gpu_states``: the sampler's :class:`kernellab._busy.StateTally`), a row per
    state the GPU was held in, with the host's CPU; nothing for a pace without them (an older page)."""
    st = p.get("gpu_states") or {}
    if not st.get("held"):
        return []
    f = lambda v, fmt="{:.1f}": "-" if v is None else fmt.format(v)  # noqa: E731
    lines = [f"GPU time by what held it ({st['samples']} samples; host CPU busy {f(p.get('host_cpu_busy'), '{:.0%}')}, "
             f"this process {f(p.get('process_cpus'), '{:.2f}')} CPUs, jobs waiting for a slot {f(st.get('queued_mean'))} "
             "on average):", "", "| held | share of the time | GPU util % there | sandbox threads in each phase (mean) |",
             "|---|---|---|---|"]
    for label, row in st["held"].items():
        doing = ", ".join(f"{k} {v:g}" for k, v in list(row["doing"].items())[:8])
        lines.append(f"| {label} | {f(row['share'], '{:.0%}')} | {f(row['util'])} | {doing or '-'} |")
    return [*lines, ""]


def _md_summary(result: dict, share: float) -> list[str]:
    s = result["summary"]
    total = s["problems"]
    # interpreted, a launch of its own counts (vocab.counts_as_kernel_win): there is no share, and no speedup to win
    what = ("a correct candidate that launches its own kernels (interpreted: no speedup, nothing is won)"
            if s["interpreted"] else f"a correct kernel win (own-kernel share >= {share:g}")
    lines = ["## Summary", "", f"{s['correct']}/{total} problems with {what}"
             + (f"{', library-only allowed' if result.get('allow_library') else ''})" if not s["interpreted"] else "")
             + (f"; {s['not_counted']} more correct but not counted (library-only or lower share)"
                if s.get("not_counted") else "") + ".", "",
             "| measure | vs eager | vs torch.compile |", "|---|---|---|"]
    for p in THRESHOLDS:
        a, b = s[f"fast_{p:g}_eager"], s[f"fast_{p:g}_compile"]
        lines.append(f"| fast_{p:g} | {'-' if a is None else f'{a:.2f}'} | {'-' if b is None else f'{b:.2f}'} |")
    lines.append(f"| geomean speedup, correct problems | {_x(s['geomean_eager_correct'])} | {_x(s['geomean_compile_correct'])} |")
    lines.append(f"| geomean speedup, all problems (incorrect or unfinished = 1.0x) | {_x(s['geomean_eager_all'])} | "
                 f"{_x(s['geomean_compile_all'])} |")
    lines += ["", f"Failures by class (all evaluations): {json.dumps(s['failures'], sort_keys=True) or '{}'}", ""]
    return lines


def _md_problem(r: dict, share: float) -> str:
    """One problem's row of the table."""
    if not r.get("finished", True):
        note = f"not finished: {r.get('state') or 'unfinished'}"
        if r.get("campaign_error"):
            note += f"; {r['campaign_error'][:80]}"
        return f"| {r['problem']} | {note} | - | - | - | - | - | - | - | - |"
    if not r["correct"]:
        nc = r.get("not_counted")
        if nc and nc["reason"] == "library_only":
            note = "library-only correct, not counted"
        elif nc:
            sh = nc.get("own_kernel_share")
            note = f"correct, own-kernel share {'?' if sh is None else f'{sh:.2f}'} < {share:g}, not counted"
        else:
            note = "no correct candidate"
        return f"| {r['problem']} | no ({note}) | - | - | - | - | - | - | - | - |"
    band = f"{r['median_ms']:.4g} ({r['p20_ms']:.4g}–{r['p80_ms']:.4g})" if r["p20_ms"] else f"{r['median_ms']:.4g}"
    return (f"| {r['problem']} | yes | {band} | {r['eager_ms'] or 0:.4g} | "
            f"{'-' if r['compile_ms'] is None else format(r['compile_ms'], '.4g')} | {_x(r['speedup_eager'])} | "
            f"{_x(r['speedup_compile'])} | {r['evaluations_to_best']} | {r['seconds_to_best']} | "
            f"{' → '.join(r['actions'])} |")


def config_kwargs(**opts: Any) -> dict:
    """Filter CLI options down to CampaignConfig fields (problems excluded)."""
    fields = set(CampaignConfig.__dataclass_fields__) - {"problems"}
    return {k: v for k, v in opts.items() if k in fields}


__all__ = ["run_bench", "bench_summary", "suite_paths", "parse_shard", "shard_indices", "bench_config", "config_hash",
           "summarize", "to_markdown", "problem_row", "pace_line", "BenchError", "KERNEL_SHARE_MIN"]
