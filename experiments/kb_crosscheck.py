"""Cross-check a bench database against KernelBench's own harness.

    PYTHONPATH=. python experiments/kb_crosscheck.py --db bench.db [--kernelbench ../shared/kernelbench]
        [--config-hash H] [--problem NAME]... [--trials 5] [--perf-trials 100] [--jobs 1] [--out-dir experiments/results]

For every problem of the database (per problem the latest finished campaign; ``--config-hash`` keeps the
bench campaigns of one configuration, see ``kernellab bench``), the winner is exported exactly as
``kernellab export`` writes it -- and, where it is another candidate (a library-only one is fastest), the
best own-kernel candidate too, the bench's "correct own-kernel winner" -- and each is judged by
KernelBench's ``eval_kernel_against_ref`` (5 correctness trials, cuda-event timing of the candidate and of
the reference, the same defaults as KernelBench's own scripts; backend "triton": the file is imported from a
temp file, which ``@triton.jit`` needs). Each KernelBench run is a child process, so a crash or a CUDA fault
costs one row. Writes ``<date>-<device>-kb-crosscheck.md`` and ``.json``: per problem both harnesses'
verdicts and speedups side by side, and the agreement counts; device, versions, kernellab commit,
KernelBench's commit and the date.

``--jobs N`` runs N KernelBench children at once, for the suite's large problems, whose runs draw
KernelBench's inputs on the CPU seven times (``get_inputs()``, 6.4 GB a tensor at level 1). The GPU stays
one child's at a time (:class:`_GpuTurn`): a child holds it for all its work but the problem's
``get_inputs()``, so every timing runs with the GPU to itself; a run that ran out of memory beside the
others is judged again alone. Memory is admitted too (:func:`host_admission`, the sandbox's own admission): a
child starts when its problem's parameters, inputs and outputs (meta device) fit beside the running children's
in what the host had available at the start above the sandbox's floor, and in half the card, or alone.

KernelBench's eval is CUDA-only: without a CUDA device the script stops with one line (exit 2).
Known differences it may show: KernelBench casts every input tensor to the precision (integer
indices and boolean masks included; kernellab keeps their dtype); it calls the reference and then the
candidate without reseeding, so a forward that draws random numbers (dropout in training mode) draws them
differently for the two, and the problem's own reference can fail its check (kernellab reseeds before each call;
``experiments/kb_reference_control.py`` judges a problem's reference as the candidate); and a campaign run at
SMALL sizes is judged here at the problem's full sizes (the row says so).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# ../shared/kernelbench beside the checkout, or KERNELBENCH_DIR (a GPU host gets a copy carried in the tree)
DEFAULT_KB = Path(os.environ.get("KERNELBENCH_DIR") or ROOT.parent / "shared" / "kernelbench")
PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


class CrosscheckError(Exception):
    """Bad input: printed as one line, exit 2."""


# -- reading the database (pure: no GPU, no KernelBench) ---------------------------------------------------
def _const(source: str, name: str) -> Any:
    """A module-level constant of the problem (``DTYPE``, ``ATOL``...), read without executing the file."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def winners(store: Any, config_hash: str | None = None, problems: list[str] | None = None) -> list[dict]:
    """One row per problem: its latest finished campaign's winner (``store.best``, what ``export``
    exports) with kernellab's verdict and the exported source (None when nothing is correct)."""
    from kernellab import export

    latest: dict[str, dict] = {}
    for camp in store.list_campaigns():
        cfg = camp.get("config") or {}
        if camp["status"] != "done":
            continue
        if config_hash is not None and ((cfg.get("bench") or {}).get("config_hash") != config_hash):
            continue
        for pid in cfg.get("problem_ids") or []:
            if pid not in latest or (camp["updated_at"] or "") >= (latest[pid]["updated_at"] or ""):
                latest[pid] = camp
    rows = []
    for pid, camp in latest.items():
        prob = store.get_problem(pid)
        if problems and prob["name"] not in problems and pid not in problems:
            continue
        best = store.best(camp["id"], pid)
        small = camp["config"].get("small")
        base: dict[str, Any] = {
            "problem": prob["name"], "problem_id": pid, "path": prob["path"], "campaign": camp["name"],
            "campaign_id": camp["id"], "device": camp["device"], "dtype": _const(prob["source"], "DTYPE") or "float32",
            "own_tolerance": any(_const(prob["source"], k) is not None for k in ("ATOL", "RTOL")),
            "small": bool(small) if small is not None else camp["device"].startswith("cpu"),
            "reference": prob["source"], "source": None, "kernelbench": None, "winner": "exported"}
        if not best:
            rows.append({**base, "kernellab": {"correct": False, "status": "no correct candidate"}})
            continue
        # the exported winner (fastest correct, a library-only one too) and, where it is another candidate, the
        # best kernel win: the bench's "correct own-kernel winner" is that one, so it is judged too
        own = store.best(camp["id"], pid, library=False, kernel=True)
        picks = [(best[0], True, "exported")]
        if own and (own[0]["candidate_id"], own[0]["config_json"]) != (best[0]["candidate_id"], best[0]["config_json"]):
            picks.append((own[0], False, "own-kernel"))
        for e, library, which in picks:
            row = {**base, "winner": which}
            row["kernellab"] = {
                "correct": True, "status": "correct", "candidate_id": e["candidate_id"], "evaluation_id": e["id"],
                "interpreted": bool(e["interpreted"]), "median_ms": e["median_ms"], "eager_ms": e["eager_ms"],
                "speedup_eager": None if e["interpreted"] else e["speedup_eager"],
                "speedup_compile": None if e["interpreted"] else e["speedup_compile"],
                "own_kernel_share": e["own_kernel_share"], "library_only": bool(e["library_only"])}
            row["source"] = export.export_source(store, camp["id"], pid, library=library)
            rows.append(row)
    if problems:
        missing = sorted(set(problems) - {r["problem"] for r in rows} - {r["problem_id"] for r in rows})
        if missing:
            raise CrosscheckError(f"no finished campaign for problem(s) {', '.join(missing)} in {store.path}")
    return sorted(rows, key=lambda r: (r["problem"], r["winner"] != "exported"))


# -- the comparison (pure) ------------------------------------------------------------------------------------
def compare(rows: list[dict]) -> dict:
    """Fills each row's ``agreement`` and returns the counts. A row whose KernelBench verdict is
    missing (no winner to export, or the run failed before a verdict) is counted apart."""
    counts = {"problems": len(rows), "both_correct": 0, "both_not_correct": 0, "kernellab_only_correct": 0,
              "kernelbench_only_correct": 0, "no_winner": 0, "kernelbench_no_verdict": 0,
              "speedup_compared": 0, "speedup_same_side_of_1x": 0, "speedup_within_10pct": 0}
    for r in rows:
        kl, kb = r["kernellab"], r.get("kernelbench")
        if r.get("source") is None:
            r["agreement"] = "no winner"
            counts["no_winner"] += 1
            continue
        if kb is None or kb.get("correctness") is None:
            r["agreement"] = "no KernelBench verdict"
            counts["kernelbench_no_verdict"] += 1
            continue
        key = {(True, True): "both_correct", (False, False): "both_not_correct",
               (True, False): "kernellab_only_correct", (False, True): "kernelbench_only_correct"}[
            (bool(kl["correct"]), bool(kb["correctness"]))]
        counts[key] += 1
        r["agreement"] = key.replace("_", " ")
        a, b = kl.get("speedup_eager"), kb.get("speedup")
        if key == "both_correct" and a and b:
            counts["speedup_compared"] += 1
            counts["speedup_same_side_of_1x"] += (a > 1.0) == (b > 1.0)
            counts["speedup_within_10pct"] += abs(b / a - 1.0) <= 0.10
    judged = sum(counts[k] for k in ("both_correct", "both_not_correct", "kernellab_only_correct",
                                     "kernelbench_only_correct"))
    counts["verdicts_compared"] = judged
    counts["verdicts_agree"] = counts["both_correct"] + counts["both_not_correct"]
    return counts


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def to_markdown(result: dict) -> str:
    env, c = result["environment"], result["agreement"]
    v = env["versions"]
    lines = [f"# KernelBench cross-check of `{result['db']}` — {env['date']}", "",
             f"Device: {env['device']}; torch {v.get('torch')}, triton {v.get('triton')}, cuda {v.get('cuda')}, "
             f"kernellab {v.get('kernellab')} (commit {v.get('commit')}); KernelBench {env['kernelbench_commit']} "
             f"at `{env['kernelbench']}`.",
             f"KernelBench settings: {json.dumps(result['settings'], sort_keys=True)}", "",
             f"**Verdicts agree on {c['verdicts_agree']} of {c['verdicts_compared']} winners** "
             f"(both correct {c['both_correct']}, both not correct {c['both_not_correct']}, kernellab only "
             f"{c['kernellab_only_correct']}, KernelBench only {c['kernelbench_only_correct']}); "
             f"{c['no_winner']} problems without a correct kernellab candidate, {c['kernelbench_no_verdict']} "
             "without a KernelBench verdict." + (
                 f" {c['reference_fails_kernelbench']} of the disagreeing or unjudged problems are ones whose own "
                 "reference fails KernelBench's order (`kb_reference_control.py`, the note says how)."
                 if c.get("reference_fails_kernelbench") else ""),
             f"Speedups (both correct, both timed: {c['speedup_compared']}): on the same side of 1.0x "
             f"{c['speedup_same_side_of_1x']}, within 10% {c['speedup_within_10pct']}. kernellab's speedup is "
             "eager median / candidate median (interleaved, L2 flushed); KernelBench's is its reference mean / "
             "candidate mean over its timing trials, the reference timed after the candidate.",
             _cost_line(result["problems"], result.get("wall_s"), result["settings"].get("jobs", 1)), "",
             "| problem | kernellab | KernelBench | kernellab vs eager | KernelBench vs reference | agreement | note |",
             "|---|---|---|---|---|---|---|"]
    for r in result["problems"]:
        kl, kb = r["kernellab"], r.get("kernelbench") or {}
        kb_verdict = "-" if not kb else ("correct" if kb.get("correctness") else
                                         "not compiled" if kb.get("compiled") is False else
                                         "no verdict" if kb.get("correctness") is None else "incorrect")
        notes = []
        if r.get("small"):
            notes.append("kernellab ran SMALL sizes")
        if r.get("own_tolerance"):
            notes.append("problem sets ATOL/RTOL; KernelBench uses its own")
        if kl.get("library_only"):
            notes.append("library-only winner")
        if r.get("winner") == "own-kernel":
            notes.append("the best own-kernel candidate (the exported winner is the row above)")
        if kb.get("excessive_speedup"):
            notes.append("KernelBench flags excessive speedup")
        if kb.get("error"):
            notes.append(kb["error"][:100].replace("|", "/").replace("\n", " "))
        if r.get("reference_control"):
            notes.append(control_note(r["reference_control"])[:200].replace("|", "/"))
        lines.append(f"| {r['problem']} | {kl['status']} | {kb_verdict} | {_x(kl.get('speedup_eager'))} | "
                     f"{_x(kb.get('speedup'))} | {r.get('agreement', '-')} | {'; '.join(notes)} |")
    return "\n".join(lines) + "\n"


def _cost_line(rows: list[dict], wall_s: float | None = None, jobs: int = 1) -> str:
    """How many KernelBench runs this cross-check made and their wall time (a verdict kept from an earlier
    cross-check cost nothing here): what judging the rest of a suite will cost in device time."""
    ran = [kb["seconds"] for r in rows if (kb := r.get("kernelbench") or {}).get("seconds") is not None
           and "kept_from" not in kb]
    kept = sum(1 for r in rows if "kept_from" in (r.get("kernelbench") or {}))
    alone = sum(1 for r in rows if (r.get("kernelbench") or {}).get("rerun_alone"))
    took = f"; the cross-check's wall time {wall_s:.0f} s" if wall_s is not None else ""
    waits = [kb["host_wait_s"] for r in rows if (kb := r.get("kernelbench") or {}).get("host_wait_s") is not None
             and "kept_from" not in kb]
    held = f", {sum(waits):.0f} s waiting for host memory" if waits else ""
    together = f" with --jobs {jobs} ({alone} judged again alone{held})" if jobs > 1 else ""
    return (f"KernelBench ran {len(ran)} times here, {sum(ran):.0f} s in all"
            + (f" (mean {sum(ran) / len(ran):.1f} s)" if ran else "") + f"{took}{together}; "
            f"{kept} verdicts kept from earlier.")


# -- running KernelBench (a child process per problem) --------------------------------------------------------
def import_kernelbench(kb: Path) -> Any:
    """KernelBench's ``eval`` module. Its package imports dotenv, litellm and openai for its LLM
    helpers, which the eval path never calls: stubs stand in for them."""
    for name, attrs in {"dotenv": ["load_dotenv"], "litellm": ["completion"], "openai": ["OpenAI"]}.items():
        if name not in sys.modules:
            mod = types.ModuleType(name)
            for a in attrs:
                setattr(mod, a, lambda *args, **kw: None)
            sys.modules[name] = mod
    sys.path.insert(0, str(kb / "src"))
    from kernelbench import eval as kb_eval

    return kb_eval


class _GpuTurn:
    """The GPU, one KernelBench child at a time: an exclusive ``flock`` on a file the parent names, held for
    the child's whole run but the problem's ``get_inputs()`` (KernelBench draws inputs on the CPU, then moves
    them). So while one child compiles, checks or times on the GPU, the others can only be drawing inputs.
    ``device_inputs``: a ``get_inputs()`` returned a tensor off the CPU, i.e. used the GPU outside its turn
    (the parent judges that run again alone)."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "a")  # noqa: SIM115 - held for the process's life
        self.wait_s = 0.0
        self.device_inputs = False

    def acquire(self) -> None:
        t0 = time.monotonic()
        fcntl.flock(self._f, fcntl.LOCK_EX)
        self.wait_s += time.monotonic() - t0

    def release(self) -> None:
        fcntl.flock(self._f, fcntl.LOCK_UN)

    def around_inputs(self, get_inputs: Callable) -> Callable:
        def drawn_off_turn(*args: Any, **kwargs: Any) -> Any:
            self.release()
            try:
                out = get_inputs(*args, **kwargs)
            finally:
                self.acquire()
            if any(getattr(getattr(x, "device", None), "type", "cpu") != "cpu" for x in out or []):
                self.device_inputs = True
            return out

        return drawn_off_turn


def _take_turns(kb_eval: Any, turn: _GpuTurn) -> None:
    """KernelBench's loader hands the problem's ``get_inputs`` to every place that draws inputs: wrap it there."""
    load = kb_eval.load_original_model_and_inputs

    def load_taking_turns(src: str, context: dict) -> Any:
        got = load(src, context)
        if got is None or got[2] is None:
            return got
        model, get_init_inputs, get_inputs = got
        return model, get_init_inputs, turn.around_inputs(get_inputs)

    kb_eval.load_original_model_and_inputs = load_taking_turns


def _child(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    kb_eval = import_kernelbench(Path(job["kernelbench"]))
    precision = kb_eval.get_torch_dtype_from_string(job["precision"])
    out: dict[str, Any] = {}
    turn = _GpuTurn(job["gpu_turn"]) if job.get("gpu_turn") else None
    if turn is not None:
        _take_turns(kb_eval, turn)
        turn.acquire()
    try:
        res = None
        for _ in range(2):  # None = KernelBench's "lock file error, please retry"
            res = kb_eval.eval_kernel_against_ref(
                original_model_src=job["reference"], custom_model_src=job["source"],
                num_correct_trials=job["trials"], num_perf_trials=job["perf_trials"], measure_performance=True,
                timing_method=job["timing_method"], backend="triton", precision=precision,
                build_dir=job["build_dir"], check_for_excessive_speedup=True, excessive_speedup_threshold=10)
            if res is not None:
                break
        if res is None:
            out = {"compiled": None, "correctness": None, "error": "KernelBench returned no result (lock file error twice)"}
        else:
            md = res.metadata or {}
            errs = [f"{k}: {md[k]}" for k in sorted(md) if "error" in k and md[k]]
            out = {"compiled": res.compiled, "correctness": res.correctness,
                   "runtime": res.runtime if res.runtime and res.runtime > 0 else None,
                   "ref_runtime": res.ref_runtime if res.ref_runtime and res.ref_runtime > 0 else None,
                   "excessive_speedup": bool(md.get("excessive_speedup")), "hardware": md.get("hardware"),
                   "error": "; ".join(errs)[:2000] or None}
            if out["runtime"] and out["ref_runtime"]:
                out["speedup"] = out["ref_runtime"] / out["runtime"]
    except Exception as exc:  # an exception of the harness itself, not a verdict
        out = {"compiled": None, "correctness": None, "error": f"{type(exc).__name__}: {exc}"[:2000],
               "harness_raised": True}
    finally:
        if turn is not None:
            turn.release()
            out.update(gpu_wait_s=round(turn.wait_s, 1), device_inputs=turn.device_inputs)
    Path(job["out"]).write_text(json.dumps(out, default=str))


def run_kernelbench(row: dict, kb: Path, trials: int, perf_trials: int, timing_method: str, timeout_s: float,
                    gpu_turn: str | None = None) -> dict:
    """KernelBench's verdict on ``row``'s source, from a child process, with ``seconds``: the run's wall time
    (what the cross-check of a whole suite costs in device time, run by run; beside other runs, ``gpu_wait_s``
    of it went to waiting for the GPU's turn)."""
    t0 = time.monotonic()
    out = _run_kernelbench(row, kb, trials, perf_trials, timing_method, timeout_s, gpu_turn)
    return {**out, "seconds": round(time.monotonic() - t0, 1)}


# the KernelBench children running now: an interrupted cross-check stops them (their verdicts are not kept)
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set by an interrupt: no child starts, and no verdict is kept, from then on


def _stop_children() -> None:
    with _LIVE_LOCK:
        _STOPPING.set()  # a child started from now on is stopped as it starts
        for p in _LIVE:
            with contextlib.suppress(OSError):
                p.send_signal(signal.SIGKILL)


def _run_kernelbench(row: dict, kb: Path, trials: int, perf_trials: int, timing_method: str, timeout_s: float,
                     gpu_turn: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="kb-crosscheck-") as tmp:
        job = {"kernelbench": str(kb), "reference": row["reference"], "source": row["source"],
               "precision": PRECISIONS.get(row["dtype"], "fp32"), "trials": trials, "perf_trials": perf_trials,
               "timing_method": timing_method, "build_dir": str(Path(tmp) / "build"), "out": str(Path(tmp) / "out.json"),
               "gpu_turn": gpu_turn}
        Path(tmp, "job.json").write_text(json.dumps(job))
        p = subprocess.Popen([sys.executable, __file__, "--_child", str(Path(tmp, "job.json"))], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=tmp)
        with _LIVE_LOCK:
            _LIVE.add(p)
            if _STOPPING.is_set():
                p.kill()
        try:
            stdout, stderr = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            return {"compiled": None, "correctness": None, "error": f"KernelBench run timed out after {timeout_s:.0f} s"}
        except BaseException:  # an interrupt: the child goes with it
            p.kill()
            p.wait()
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(p)
        out = Path(job["out"])
        if not out.exists():
            tail = (stderr or stdout or "").strip().splitlines()[-3:]
            return {"compiled": None, "correctness": None,
                    "error": f"KernelBench's process ended with code {p.returncode}: {' / '.join(tail)}"[:2000]}
        return json.loads(out.read_text())


_OOM = re.compile(r"out of memory", re.IGNORECASE)


def alone_reason(kb: dict) -> str | None:
    """Why a run made beside others is judged again alone, or None: it ran out of memory (the others held
    theirs), or its problem's ``get_inputs()`` used the GPU outside its turn."""
    if kb.get("device_inputs"):
        return "get_inputs() used the GPU outside the run's turn"
    if _OOM.search(kb.get("error") or ""):
        return "out of memory beside other KernelBench runs"
    return None


def host_need(row: dict) -> int | None:
    """Bytes a KernelBench child of ``row`` holds on the host at once, at most: the reference's parameters,
    one trial's inputs (drawn on the CPU, then moved) and outputs, built on the meta device
    (``sandbox._gpu.estimate``'s floor); None where the problem cannot be built there."""
    from kernellab.problem import Problem
    from kernellab.sandbox._gpu import estimate_floor_bytes

    return estimate_floor_bytes(Problem(name=row["problem"], source=row["reference"]), small=False)  # full size


def host_admission(device_bytes: int | None = None) -> Any:
    """The children's memory admission: the sandbox's own :class:`~kernellab.sandbox._gpu.MemoryBudget` (as
    many at once as fit, one whose need is unknown or above the budget alone, a large one passed at most
    ``MAX_BYPASS`` times) over what the host has available now above the sandbox's floor; None where the
    host's memory is unknown. ``device_bytes`` (the card's memory) caps it at half the card less 4 GiB: a child
    keeps its parameters, inputs and both models' outputs on the card between its turns, about twice what it
    holds on the host (a run out of memory beside the others is judged again alone, at the cost of a second
    run). At least 1 byte: a budget of none admits one child at a time."""
    from kernellab.sandbox._gpu import MemoryBudget
    from kernellab.sandbox._reference import host_floor, host_memory

    mem = host_memory()
    if mem is None:
        return None
    budget = max(0, mem[0] - host_floor(mem[1]))
    if device_bytes:
        budget = min(budget, max(0, device_bytes // 2 - 4 * 2**30))
    return MemoryBudget(max(1, budget))


def judging_order(todo: list[dict]) -> list[dict]:
    """The rows to judge, the largest claimed speedup over eager first (ties in the suite's order): a call cut off
    by its time leaves unjudged the claims that matter least (a 5.9x level-2 winner waited behind dozens of
    1.0x ones in session 35)."""
    def claim(r: dict) -> float:
        got = (r.get("kernellab") or {}).get("speedup_eager")
        return -got if isinstance(got, (int, float)) else 0.0

    return sorted(todo, key=claim)


def judge_all(todo: list[dict], run: Callable[[dict, str | None], dict], jobs: int, turn_file: str,
              report: Callable[[dict], None] = lambda row: None, admission: Any = None,
              need: Callable[[dict], int | None] = host_need) -> bool:
    """``row["kernelbench"] = run(row, gpu_turn)`` for each row of ``todo``, ``jobs`` at a time (taking turns on
    the GPU through ``turn_file``; one at a time: no turns), then again alone where :func:`alone_reason` says.
    With ``admission`` (:func:`host_admission`) a row's child starts only when its ``need`` is admitted (its verdict
    gets ``host_need_gb`` and ``host_wait_s``). Returns whether it was interrupted: a row judged after the
    interrupt keeps no verdict (the children were stopped mid-run)."""
    if jobs <= 1:
        for row in todo:
            try:
                row["kernelbench"] = run(row, None)
            except KeyboardInterrupt:
                return True
            report(row)
        return False
    def one(row: dict) -> None:
        if _STOPPING.is_set():
            return
        if admission is None:
            got = run(row, turn_file)
        else:
            n = need(row)
            t0 = time.monotonic()
            with admission.admitted(n):
                waited = time.monotonic() - t0
                if _STOPPING.is_set():
                    return
                got = run(row, turn_file)
            got = {**got, "host_need_gb": None if n is None else round(n / 1e9, 2), "host_wait_s": round(waited, 1)}
        if not _STOPPING.is_set():
            row["kernelbench"] = got
            report(row)

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="kb-crosscheck")
    _STOPPING.clear()
    # A SIGINT only sets a flag here: raised as KeyboardInterrupt it could land inside a lock's release in
    # wait() and surface as "RuntimeError: release unlocked lock" (the H200 cross-check of session 34), past
    # the handler below, leaving the children running and no page written.
    interrupted = threading.Event()
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set()) if main else None
    try:
        pending = {pool.submit(one, row) for row in todo}
        while pending:
            done, pending = wait(pending, timeout=0.5)
            for f in done:
                f.result()
            if interrupted.is_set():
                raise KeyboardInterrupt  # stopped below, while the flag-setting handler is still installed
    except KeyboardInterrupt:  # the flag, judged off the main thread (the caller's handler raises), or a run's own
        _stop_children()
        pool.shutdown(wait=True, cancel_futures=True)
        return True
    finally:
        if main:
            signal.signal(signal.SIGINT, old)
    pool.shutdown()
    for row in todo:
        why = alone_reason(row.get("kernelbench") or {})
        if why is None:
            continue
        try:
            row["kernelbench"] = {**run(row, None), "rerun_alone": why}
        except KeyboardInterrupt:
            row.pop("kernelbench", None)
            return True
        report(row)
    return False


# -- the reference control of a disagreement ---------------------------------------------------------------
CONTROL = Path(__file__).resolve().parent / "kb_reference_control.py"


def needs_control(row: dict) -> bool:
    """Rows KernelBench's own order may explain: kernellab correct and KernelBench not, or KernelBench's
    harness raising instead of giving a verdict (not a run interrupted, timed out or crashed)."""
    return row.get("agreement") == "kernellab only correct" or bool((row.get("kernelbench") or {}).get("harness_raised"))


def reference_controls(rows: list[dict], device: str, timeout_s: float = 300.0, trials: int = 2) -> None:
    """Runs ``kb_reference_control.py --json`` (a child process) once per problem of the rows that need it
    (not again where a row has it) and stores its finding as their ``reference_control``."""
    found: dict[str, dict] = {r["problem_id"]: r["reference_control"] for r in rows if r.get("reference_control")}
    for r in rows:
        if not needs_control(r):
            continue
        if r["problem_id"] not in found:
            found[r["problem_id"]] = _control(r["reference"], device, timeout_s, trials)
        r["reference_control"] = found[r["problem_id"]]


def reference_fails(rows: list[dict]) -> int:
    """How many problems of the rows needing a control have a reference that fails KernelBench's order."""
    return len({r["problem_id"] for r in rows
                if needs_control(r) and (r.get("reference_control") or {}).get("passes") is False})


def _control(reference: str, device: str, timeout_s: float, trials: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="kb-refctl-") as tmp:
        problem = Path(tmp) / "problem.py"
        problem.write_text(reference)
        try:
            p = subprocess.run([sys.executable, str(CONTROL), str(problem), "--json", "--device", device,
                                "--trials", str(trials)], capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
        except subprocess.TimeoutExpired:
            return {"passes": None, "error": f"the reference control timed out after {timeout_s:.0f} s"}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (p.stderr or p.stdout or "").strip().splitlines()[-1:]
        return {"passes": None, "error": f"the reference control ended with code {p.returncode}: {' '.join(tail)}"[:500]}


def control_note(c: dict) -> str:
    if c.get("passes") is None:
        return c.get("error") or "the reference control gave no finding"
    if c["passes"]:
        return "the problem's own reference passes KernelBench's order (kb_reference_control)"
    bad = [t for t in c["trials"] if not t.get("pass")]
    raised = next((t["error"] for t in bad if "error" in t), None)
    if raised:
        return f"the problem's own reference raises in KernelBench's order: {raised}"
    worst = max(t["max_diff"] for t in bad)
    return (f"the problem's own reference fails KernelBench's order in {len(bad)} of {len(c['trials'])} trials "
            f"(max |diff| {worst:.1e}; kb_reference_control)")


def _kb_commit(kb: Path) -> str:
    """KernelBench's own checkout's commit, else the one its README names. A copy inside another repository
    (the .kb carried to the GPU host) is not a checkout: git would answer with the outer repository's HEAD
    (the H200 cross-check of session 10 named kernellab's commit as KernelBench's)."""
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(kb), *args], capture_output=True, text=True,
                                  check=True).stdout.strip()

        if Path(git("rev-parse", "--show-toplevel")).resolve() == kb.resolve():
            return git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        pass
    m = re.search(r"commit ([0-9a-f]{7,40})", (kb / "README.md").read_text()) if (kb / "README.md").exists() else None
    return m.group(1) if m else "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", help="the bench database (kernellab.db of `kernellab bench`)")
    ap.add_argument("--kernelbench", default=str(DEFAULT_KB), help="KernelBench's folder [$KERNELBENCH_DIR or ../shared/kernelbench]")
    ap.add_argument("--config-hash", default=None, help="only the bench campaigns of this configuration hash")
    ap.add_argument("--problem", action="append", default=None, help="only this problem (name or id; repeatable)")
    ap.add_argument("--trials", type=int, default=5, help="KernelBench correctness trials [5]")
    ap.add_argument("--perf-trials", type=int, default=100, help="KernelBench timing trials [100]")
    ap.add_argument("--timing-method", default="cuda_event")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per KernelBench run [900]")
    ap.add_argument("--jobs", type=int, default=1,
                    help="KernelBench runs at once, taking turns on the GPU: only drawing inputs overlaps [1]")
    ap.add_argument("--out-dir", default=str(ROOT / "experiments" / "results"))
    ap.add_argument("--keep", default=None, metavar="JSON",
                    help="an earlier cross-check's JSON: its KernelBench verdicts of the same evaluations are kept, not "
                         "run again (a suite cross-checked as its bench grows, call by call)")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        _child(args._child)
        return 0
    try:
        return _main(args)
    except CrosscheckError as exc:
        print(f"kb_crosscheck: error: {exc}", file=sys.stderr)
        return 2


def _judged(row: dict) -> tuple | None:
    """What a KernelBench verdict is of: the problem, which winner, and kernellab's evaluation of it."""
    kl = row.get("kernellab") or {}
    return (row["problem_id"], row.get("winner", "exported"), kl["evaluation_id"]) if kl.get("evaluation_id") else None


def kept_verdicts(path: Path) -> dict[tuple, dict]:
    """An earlier cross-check's KernelBench verdicts by :func:`_judged`, and its harness exceptions (they
    recur on the same files); failed runs (interrupted, timed out, crashed) are left out: run again."""
    if not path.is_file():
        raise CrosscheckError(f"--keep {path}: no such file")
    try:
        rows = json.loads(path.read_text())["problems"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CrosscheckError(f"--keep {path}: not a kb_crosscheck JSON ({exc})") from None
    return {key: r["kernelbench"] for r in rows if (key := _judged(r)) is not None
            and ((kb := r.get("kernelbench") or {}).get("correctness") is not None or kb.get("harness_raised"))}


def _main(args: argparse.Namespace) -> int:
    from kernellab import env
    from kernellab.fileio import write_atomic
    from kernellab.store import Store

    if not args.db:
        raise CrosscheckError("--db is required (a database written by `kernellab bench`)")
    if not Path(args.db).is_file():
        raise CrosscheckError(f"{args.db}: no such database")
    kb = Path(args.kernelbench).resolve()  # the KernelBench children run in temporary directories
    if not (kb / "src" / "kernelbench" / "eval.py").is_file():
        raise CrosscheckError(f"{kb}: not a KernelBench folder (no src/kernelbench/eval.py); pass --kernelbench")
    if not env.has_cuda():
        raise CrosscheckError("KernelBench's eval_kernel_against_ref needs a CUDA device and none is visible")
    rows = winners(Store(args.db), args.config_hash, args.problem)
    if not rows:
        raise CrosscheckError(f"{args.db}: no finished campaign" + (f" with config hash {args.config_hash}"
                                                                    if args.config_hash else ""))
    if args.jobs < 1:
        raise CrosscheckError(f"--jobs {args.jobs}: must be 1 or more")
    kept = kept_verdicts(Path(args.keep)) if args.keep else {}
    todo = []
    for r in rows:
        known = kept.get(_judged(r))
        if known is not None:
            r["kernelbench"] = {**known, "kept_from": args.keep}
        elif r["source"] is not None:
            todo.append(r)
    index = {id(r): k for k, r in enumerate(rows, 1)}

    def report(r: dict) -> None:
        kbv = r["kernelbench"] or {}
        took = f" ({kbv['seconds']:.0f} s)" if kbv.get("seconds") is not None else ""
        again = f", again alone: {kbv['rerun_alone']}" if kbv.get("rerun_alone") else ""
        print(f"kb_crosscheck: {index[id(r)]}/{len(rows)} {r['problem']}: kernellab {r['kernellab']['status']}, "
              f"KernelBench {kbv.get('correctness', '-')}{took}{again}", file=sys.stderr)

    def run(r: dict, turn: str | None) -> dict:
        return run_kernelbench(r, kb, args.trials, args.perf_trials, args.timing_method, args.timeout, turn)

    compare(rows)  # the disagreements kept from --keep get their control first: a call's time runs out judging
    reference_controls(rows, "cuda")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kb-crosscheck-turn-") as tmp:
        # a device call's time is up (SIGINT): the verdicts so far are written, the rest marked to run next time
        admission = None
        if args.jobs > 1:
            import torch

            admission = host_admission(torch.cuda.get_device_properties(0).total_memory)
        interrupted = judge_all(judging_order(todo), run, args.jobs, str(Path(tmp) / "gpu.lock"), report, admission)
    wall = round(time.monotonic() - t0, 1)
    for r in todo:
        r.setdefault("kernelbench", {"correctness": None, "error": "not run: interrupted"})
    counts = compare(rows)
    if not interrupted:  # after an interrupt the call's time is up: the new disagreements get theirs next time
        reference_controls(rows, "cuda")
    counts["reference_fails_kernelbench"] = reference_fails(rows)
    stamp = dt.datetime.now(dt.timezone.utc)
    device = env.device_name("cuda")
    result = {"db": args.db, "settings": {"num_correct_trials": args.trials, "num_perf_trials": args.perf_trials,
                                          "timing_method": args.timing_method, "backend": "triton",
                                          "config_hash": args.config_hash, "jobs": args.jobs,
                                          "host_budget_gb": round(admission.budget / 1e9, 1) if admission else None},
              "wall_s": wall,
              "environment": {"date": stamp.isoformat(timespec="seconds"), "device": device, "versions": env.versions(),
                              "kernelbench": str(kb), "kernelbench_commit": _kb_commit(kb),
                              "thp_mem_alloc_enable": os.environ.get("THP_MEM_ALLOC_ENABLE")},
              "agreement": counts,
              "problems": [{k: v for k, v in r.items() if k not in ("reference", "source")} for r in rows]}
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")[:24]
    stem = Path(args.out_dir) / f"{stamp.strftime('%Y-%m-%d')}-{slug}-kb-crosscheck"
    write_atomic(stem.with_suffix(".json"), json.dumps(result, indent=2, default=str))
    write_atomic(stem.with_suffix(".md"), to_markdown(result))
    if interrupted:
        print("kb_crosscheck: interrupted; the unjudged winners are marked 'not run' (pass this JSON as --keep)",
              file=sys.stderr)
    print(f"kb_crosscheck: verdicts agree on {counts['verdicts_agree']} of {counts['verdicts_compared']}; "
          f"{stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # the children's KernelBench inputs are drawn into fresh host pages (6.4 GB a tensor at level 1); with torch's
    # allocator on huge pages a copy into such pages ran 2.56x faster (2026-12-05-nvidia-h100-host-copies-thp-s31.md)
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    sys.exit(main())
