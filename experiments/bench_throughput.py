"""Throughput of `kernellab bench`, a change against a base commit, side by side on one GPU.

    PYTHONPATH=. python experiments/bench_throughput.py [--kernelbench DIR] [--base b1be0da] [--sides base,new]
        [--budget 4] [--jobs 4] [--base-jobs N] [--side-limit-s 1800] [--problems N | --only 23_Softmax,76_Gemm_Add_ReLU]
        [--max-ref-gb 16] [--host-floor-gb G] [--small] [--out experiments/results] [--list]

The suite is fixed by a rule (``select_suite``): KernelBench's public level 1 and level 2 files are put in
families by their names (GEMM+epilogue, conv+epilogue, transposed conv, reductions/norms, pointwise,
pooling, attention-like, other); each family's files, sorted by (level, number), give their first
``QUOTA[family]`` whose reference alone (parameters, inputs and outputs, built on the meta device) needs at
most ``--max-ref-gb`` GB: 24 problems, every family represented. ``--list`` prints it and stops.

Each side is one subprocess ``python -m kernellab.cli bench SUITE --budget B --jobs J --db <side>.db
--out-dir <dir>`` with ``PYTHONPATH`` putting that side's tree first: the change is this tree, the base a
``git worktree add`` of ``--base`` in a temporary folder (removed at the end). The sides run one after
the other, never together (they share the GPU), each with fresh compile caches, and each is stopped with
SIGINT after ``--side-limit-s`` (SIGKILL to its process tree 15 s later); its pace counts the problems it
finished. A side is stopped the same way when the host's available memory falls under ``--host-floor-gb``
(``host_watch.HostWatch``, by default half the sandbox's floor; SIGKILL sooner if it falls under half that):
a host out of memory stops answering and the run's pages are lost with it; the page says the side stopped so
and how little the host had. The page is rewritten after each side. While a
side runs, NVML is sampled every 0.5 s (``kernellab._busy.BusySampler``; nothing is said of the GPU
without NVML). ``--problems N`` / ``--only`` pick a subset for the side by side; ``--sides new`` runs the
change alone (the full suite, by default).

Writes ``<date>-<device>-throughput.md`` and ``.json`` under ``--out``: the command, device, versions,
commits and date; per side the problems finished, wall seconds, problems per hour, evaluations, evaluations
per GPU-hour (wall hours x GPUs), GPU busy share, and the seconds summed by sandbox phase and wait (each
evaluation's ``details.phase_s``, ``details.memory.admission_wait_s``); the ratio new/base of problems per
hour; per problem both sides' verdicts (correct, the winner's origin and action, its speedup) and whether
they agree. Each side's database is copied next to the page, gzipped.

Exit 0 when every side ran to its end or its limit, 1 when a side failed (its bench exited with an error),
2 on bad input.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
from host_watch import HostWatch, kill_tree  # noqa: E402 (a sibling script, importable once its folder is on the path)

# ../shared/kernelbench beside the checkout, or KERNELBENCH_DIR (a GPU host gets a copy carried in the tree, .kb)
DEFAULT_KB = Path(os.environ.get("KERNELBENCH_DIR") or ROOT.parent / "shared" / "kernelbench")
RESULTS = ROOT / "experiments" / "results"
DEFAULT_BASE = "b1be0da"  # the commit of the throughput evidence (../shared/evidence/throughput-2026-12-02.md)
KILL_AFTER_S = 15.0

# Problems per family: 24 in all. The first of each family by (level, number) are the ones taken, so the suite
# changes only when KernelBench's public files do.
QUOTA = {"gemm_epilogue": 4, "conv_epilogue": 4, "transposed_conv": 4, "reduction_norm": 4, "pointwise": 3,
         "pooling": 2, "attention": 1, "other": 2}
_POINTWISE = re.compile(r"^(relu|leakyrelu|sigmoid|tanh|swish|gelu|selu|elu|softplus|softsign|hardtanh|hardsigmoid|"
                        r"matrix_scalar_multiplication)_?$")
_REDUCTION = re.compile(r"norm|reduction|argmax|argmin|softmax|loss")


class ThroughputError(Exception):
    """Bad input: one line, exit 2."""


# -- the suite ----------------------------------------------------------------------------------------
def family(level: int, stem: str) -> str:
    """The family of KernelBench file ``level{level}/{stem}.py`` by its name (a level 2 file by its first op)."""
    name = re.sub(r"^\d+_", "", stem).lower()
    if "attention" in name:
        return "attention"
    if level >= 2:
        if name.startswith("convtranspose"):
            return "transposed_conv"
        if name.startswith("conv"):
            return "conv_epilogue"
        if name.startswith(("gemm", "matmul", "bmm")):
            return "gemm_epilogue"
        return "other"
    if name.startswith("conv_transposed"):
        return "transposed_conv"
    if "pooling" in name:
        return "pooling"
    if _POINTWISE.match(name):
        return "pointwise"
    if _REDUCTION.search(name):
        return "reduction_norm"
    return "other"


def reference_gb(path: Path) -> float | None:
    """GB the reference alone holds at full size (parameters, buffers, inputs, outputs): the sandbox's own
    floor, built on the meta device (``sandbox._gpu.estimate``); None when it cannot be built there (its
    estimate is unknown: kept)."""
    from kernellab.problem import load_problem
    from kernellab.sandbox._gpu import estimate_floor_bytes

    try:
        floor = estimate_floor_bytes(load_problem(path), small=False)
    except Exception:  # a file that does not load: unknown, as one the meta device cannot build
        return None
    return floor / 1e9 if floor is not None else None


def select_suite(kb: Path, max_ref_gb: float) -> list[dict]:
    """The fixed suite (module docstring): per family in QUOTA's order, its first files by (level, number)
    whose reference fits ``max_ref_gb``."""
    files = []
    for level in (1, 2):
        d = kb / f"level{level}"
        if not d.is_dir():
            raise ThroughputError(f"{d}: no such folder (set KERNELBENCH_DIR or --kernelbench)")
        for p in d.glob("*.py"):
            m = re.match(r"(\d+)_", p.name)
            if m:
                files.append((level, int(m.group(1)), p))
    files.sort(key=lambda f: (f[0], f[1]))
    out = []
    for fam, k in QUOTA.items():
        for level, _, p in files:
            if sum(1 for r in out if r["family"] == fam) >= k:
                break
            if family(level, p.stem) != fam:
                continue
            gb = reference_gb(p)
            if gb is not None and gb > max_ref_gb:
                continue
            out.append({"family": fam, "level": level, "name": p.stem, "path": str(p.resolve()),
                        "reference_gb": None if gb is None else round(gb, 3)})
    return out


def pick(suite: list[dict], n: int | None, only: list[str] | None) -> list[dict]:
    """``only``: the problems named (file stem, or ``level1/<stem>``); ``n``: the first n taken one family at a
    time (a small subset still spans the families); neither: the whole suite."""
    if only:
        keys = {r["name"]: r for r in suite} | {f"level{r['level']}/{r['name']}": r for r in suite}
        missing = [o for o in only if o not in keys]
        if missing:
            raise ThroughputError(f"--only: not in the suite: {', '.join(missing)} (see --list)")
        return [keys[o] for o in only]
    if n is None:
        return suite
    if n < 1:
        raise ThroughputError(f"--problems must be at least 1, got {n}")
    by_fam: dict[str, list[dict]] = {}
    for r in suite:
        by_fam.setdefault(r["family"], []).append(r)
    order = []
    while len(order) < min(n, len(suite)):
        for rows in by_fam.values():
            if rows and len(order) < n:
                order.append(rows.pop(0))
    return order


# -- one side -------------------------------------------------------------------------------------------
def _git(*args: str, cwd: Path = ROOT) -> str:
    p = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise ThroughputError(f"git {' '.join(args)}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
    return p.stdout.strip()


def _where() -> tuple[str, dict, int]:
    """(device name, versions, GPUs visible), asked of a child process: CUDA initialised in this one would
    hold a context's memory on the GPU through both sides."""
    code = ("import json, torch; from kernellab import env; "
            "print(json.dumps([env.device_name(), env.versions(), torch.cuda.device_count() if env.has_cuda() else 0]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    if p.returncode != 0:
        raise ThroughputError(f"cannot read the device and versions: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    name, versions, gpus = json.loads(p.stdout.strip().splitlines()[-1])
    return name, versions, int(gpus)


def _commit_of_tree() -> str:
    from kernellab import env

    return env.git_commit() or "unknown"


def side_jobs(label: str, args: argparse.Namespace) -> int:
    """Campaigns at once on this side: ``--base-jobs`` for the base where given (the base's best pace may be
    at another --jobs than the change's: its parallel campaigns waited on each other), else ``--jobs``."""
    return args.base_jobs if label == "base" and args.base_jobs else args.jobs


def _pyspy() -> str | None:
    """The py-spy binary: $PY_SPY, then PATH, then the copy carried in .whl (its wheel installs no binary with
    ``pip --target``)."""
    for cand in (os.environ.get("PY_SPY"), shutil.which("py-spy"), str(ROOT / ".whl" / "py-spy")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


class StackDumper(threading.Thread):
    """``py-spy dump`` of one process every ``every`` seconds, appended to ``path`` with the time since start:
    the evidence of where a bench's threads wait (admission, the lock, the GIL)."""

    def __init__(self, pid: int, every: float, path: Path, binary: str) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.path, self.binary = pid, every, path, binary
        self.halt = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        with open(self.path, "a") as f:
            while not self.halt.wait(self.every):
                try:
                    p = subprocess.run([self.binary, "dump", "--pid", str(self.pid)], capture_output=True,
                                       text=True, timeout=30)
                    text = p.stdout + p.stderr
                except (OSError, subprocess.TimeoutExpired) as exc:
                    text = f"py-spy failed: {exc!r}\n"
                f.write(f"===== t={time.monotonic() - t0:.0f}s pid {self.pid}\n{text}\n")
                f.flush()


def _gb(nbytes: int | None) -> float | None:
    return None if nbytes is None else round(nbytes / 10**9, 2)


def run_side(label: str, tree: Path, commit: str, suite_file: Path, work: Path, args: argparse.Namespace,
             gpus: int, dump_to: Path | None = None) -> dict:
    """One side's bench as a subprocess (its tree first on PYTHONPATH), NVML sampled meanwhile, stopped
    with SIGINT at the limit (SIGKILL 15 s later); returns its pace, phases and verdicts."""
    from kernellab._busy import BusySampler

    side = work / label
    (side / "out").mkdir(parents=True, exist_ok=True)
    db = side / "bench.db"
    jobs = side_jobs(label, args)
    cmd = [sys.executable, "-m", "kernellab.cli", "bench", str(suite_file), "--budget", str(args.budget),
           "--jobs", str(jobs), "--db", str(db), "--out-dir", str(side / "out"), "--json"]
    if args.small:
        cmd.append("--small")
    cmd += shlex.split(args.bench_args or "")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "KERNELLAB_COMMIT": commit, "PYTHONUNBUFFERED": "1",
           # fresh compile caches per side: the second must not run on the first one's compiled kernels
           "TORCHINDUCTOR_CACHE_DIR": str(side / "inductor-cache"), "TRITON_CACHE_DIR": str(side / "triton-cache")}
    log = side / "bench.log"
    print(f"bench_throughput: {label} ({commit}): {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    stopped = None
    with open(log, "w") as err, open(side / "bench.json", "w") as out, BusySampler(devices=None if gpus else []) as busy:
        t0 = time.monotonic()
        # SIGINT with its default action in the child, whatever this process was started with
        p = subprocess.Popen(cmd, cwd=side, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        dumper = None
        if dump_to is not None and getattr(args, "pyspy_every", 0) > 0:
            binary = _pyspy()
            if binary is None:
                print("bench_throughput: --pyspy-every: no py-spy binary (PY_SPY, PATH, .whl/py-spy)", file=sys.stderr)
            else:
                dumper = StackDumper(p.pid, args.pyspy_every, dump_to, binary)
                dumper.start()
        floor = None if args.host_floor_gb is None else int(args.host_floor_gb * 10**9)
        watch = HostWatch(p.pid, floor, grace_s=KILL_AFTER_S)
        watch.start()
        try:
            p.wait(timeout=args.side_limit_s)
        except subprocess.TimeoutExpired:
            stopped = "limit"
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=KILL_AFTER_S)
            except subprocess.TimeoutExpired:
                stopped = "limit, killed"
                kill_tree(p.pid)
                p.wait()
        except BaseException:  # this script interrupted: the side must not outlive it
            kill_tree(p.pid)
            p.wait()
            raise
        finally:
            watch.halt.set()
            watch.join(timeout=5)
        if watch.fired:
            stopped = watch.fired
        wall = time.monotonic() - t0
        if dumper is not None:
            dumper.halt.set()
            dumper.join(timeout=35)
    sampled = busy.summary()
    rc = p.returncode
    # a bench exits 1 when no problem got a correct kernel win, which is a result, not a failure
    failed = stopped is None and rc not in (0, 1)
    page = _page(side)
    facts = read_db(db) if db.exists() else {"problems_finished": 0, "evaluations": 0, "phase_s": {},
                                             "admission_wait_s": 0.0, "winners": {}, "memory": []}
    hours = wall / 3600
    gpu_hours = hours * gpus if gpus else None
    res = {"label": label, "commit": commit, "tree": str(tree), "command": cmd[1:], "returncode": rc,
           "stopped": stopped, "failed": failed, "wall_s": round(wall, 1),
           "problems": len(page["problems"]) if page else None, "problems_finished": facts["problems_finished"],
           "problems_per_hour": round(facts["problems_finished"] / hours, 2) if hours else None,
           "evaluations": facts["evaluations"],
           "evaluations_per_hour": round(facts["evaluations"] / hours, 1) if hours else None,
           "gpus": gpus, "evaluations_per_gpu_hour": round(facts["evaluations"] / gpu_hours, 1) if gpu_hours else None,
           "host_total_gb": _gb(watch.total), "host_least_available_gb": _gb(watch.least),
           "host_floor_gb": _gb(watch.floor),
           "gpu_busy_share": sampled["busy_share"], "gpu_util_mean": sampled["mean_util"],
           "gpu_samples": sampled["samples"], "gpu_sampler": sampled["error"],
           "phase_s": facts["phase_s"], "admission_wait_s": facts["admission_wait_s"], "memory": facts["memory"],
           "bench_pace": (page or {}).get("pace"), "db": str(db), "log_tail": log.read_text()[-3000:] if failed else None,
           "verdicts": verdicts(page, facts["winners"])}
    print(f"bench_throughput: {label}: {res['problems_finished']} problems finished in {wall:.0f} s"
          f"{f' (stopped: {stopped})' if stopped else ''}, {res['evaluations']} evaluations, rc {rc}",
          file=sys.stderr, flush=True)
    return res


def _page(side: Path) -> dict | None:
    """The side's bench page (its JSON result file, rewritten after every problem and at a stop)."""
    pages = sorted((side / "out").glob("*.json"), key=lambda p: p.stat().st_mtime)
    try:
        return json.loads(pages[-1].read_text()) if pages else None
    except (OSError, ValueError):
        return None


def read_db(db: Path) -> dict:
    """From a side's database with plain SQL (the base's schema may be older than this tree's store):
    finished campaigns, evaluations (reused copies left out: they cost nothing), seconds by phase and wait,
    and each problem's winner's origin and action."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        finished = con.execute("select count(*) from campaigns where status = 'done'").fetchone()[0]
        phases: dict[str, float] = {}
        n = 0
        admission = 0.0
        for (details,) in con.execute("select details_json from evaluations"):
            d = json.loads(details or "{}")
            if d.get("reused_from"):
                continue
            n += 1
            for k, v in (d.get("phase_s") or {}).items():
                phases[k] = phases.get(k, 0.0) + float(v or 0.0)
            admission += float(((d.get("memory") or {}).get("admission_wait_s")) or 0.0)
        winners = {cid: {"origin": o, "action": a}
                   for cid, o, a in con.execute("select id, origin, action from candidates")}
        memory = memory_by_problem(con)
    finally:
        con.close()
    return {"problems_finished": finished, "evaluations": n, "admission_wait_s": round(admission, 1),
            "phase_s": {k: round(v, 1) for k, v in sorted(phases.items(), key=lambda kv: -kv[1])}, "winners": winners,
            "memory": memory}


def memory_by_problem(con: sqlite3.Connection) -> list[dict]:
    """Per problem, its evaluations' memory admission (``details.memory``, ``details.retries``): the seconds they
    waited, the largest need admitted and the largest whole-job peak measured (GB), and the attempts that ran
    out of memory and were retried. Longest wait first. A need far above the peak is admission holding jobs back
    for memory they never use (session 17: two conv problems' needs doubled for good after one out-of-memory)."""
    rows: dict[str, dict] = {}
    try:
        found = con.execute("select p.name, e.details_json from evaluations e join candidates c on c.id = e.candidate_id "
                            "join problems p on p.id = c.problem_id")
        for name, details in found:
            d = json.loads(details or "{}")
            if d.get("reused_from"):
                continue
            m = d.get("memory") or {}
            r = rows.setdefault(name, {"problem": name, "evaluations": 0, "admission_wait_s": 0.0, "need_gb": 0.0,
                                       "peak_gb": 0.0, "reserved_gb": 0.0, "side_gb": 0.0, "oom_retries": 0})
            r["evaluations"] += 1
            r["admission_wait_s"] += float(m.get("admission_wait_s") or 0.0)
            r["need_gb"] = max(r["need_gb"], float(m.get("need_bytes") or 0) / 1e9)
            r["peak_gb"] = max(r["peak_gb"], float(m.get("peak_bytes") or 0) / 1e9)
            # what the grant's cap counts: above the peak by the allocator's fragmentation (since session 18)
            r["reserved_gb"] = max(r["reserved_gb"], float(m.get("peak_reserved_bytes") or 0) / 1e9,
                                   *(float(e.get("peak_reserved_bytes") or 0) / 1e9 for e in d.get("retries") or []))
            r["oom_retries"] += sum(1 for e in d.get("retries") or [] if "oom" in str(e.get("error_class") or ""))
            # all but the reference outputs kept on the device: what the side floor (_gpu.side_need) reads
            if m.get("peak_reserved_bytes"):
                side = (float(m["peak_reserved_bytes"]) - float(m.get("refs_on_device_bytes") or 0)) / 1e9
                r["side_gb"] = max(r["side_gb"], side)
    except sqlite3.Error:  # an older schema: no such table as this tree reads
        return []
    out = [{**r, "admission_wait_s": round(r["admission_wait_s"], 1), "need_gb": round(r["need_gb"], 1),
            "peak_gb": round(r["peak_gb"], 1), "reserved_gb": round(r["reserved_gb"], 1),
            "side_gb": round(r["side_gb"], 1)} for r in rows.values()]
    return sorted(out, key=lambda r: (-r["admission_wait_s"], r["problem"]))


def verdicts(page: dict | None, cands: dict) -> dict:
    """problem -> finished, correct, the winner's origin and action, its speedups (None where not measured)."""
    out = {}
    for r in (page or {}).get("problems", []):
        w = cands.get(r.get("candidate_id") or "", {})
        out[r["problem"]] = {"finished": bool(r.get("finished")), "correct": bool(r.get("correct")),
                             "origin": w.get("origin"), "action": w.get("action"),
                             "speedup_eager": r.get("speedup_eager"), "speedup_compile": r.get("speedup_compile")}
    return out


def gzip_db(db: Path, dest: Path) -> Path | None:
    """The database as one file (its WAL folded in through SQLite's backup), gzipped to ``dest``."""
    if not db.exists():
        return None
    flat = db.with_suffix(".flat.db")
    src, dst = sqlite3.connect(db), sqlite3.connect(flat)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    with open(flat, "rb") as f, gzip.open(dest, "wb") as g:
        shutil.copyfileobj(f, g)
    flat.unlink()
    return dest


# -- the page -----------------------------------------------------------------------------------------------
MEMORY_ROWS = 8  # the problems with the longest admission waits, on the page
def _f(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def compare(sides: dict[str, dict]) -> dict:
    new, base = sides.get("new"), sides.get("base")
    out: dict[str, Any] = {"problems_per_hour_ratio": None, "agree": None, "rows": []}
    if new and base and base["problems_per_hour"]:
        out["problems_per_hour_ratio"] = round((new["problems_per_hour"] or 0.0) / base["problems_per_hour"], 3)
    names = list(dict.fromkeys([*(base or {}).get("verdicts", {}), *(new or {}).get("verdicts", {})]))
    for name in names:
        b, n = (base or {}).get("verdicts", {}).get(name), (new or {}).get("verdicts", {}).get(name)
        both = b is not None and n is not None and b["finished"] and n["finished"]
        out["rows"].append({"problem": name, "base": b, "new": n, "agree": (b["correct"] == n["correct"]) if both else None})
    judged = [r["agree"] for r in out["rows"] if r["agree"] is not None]
    out["agree"] = {"judged": len(judged), "agree": sum(judged)} if new and base else None
    return out


def _jobs_text(res: dict) -> str:
    by = res.get("jobs_by_side") or {}
    if len(set(by.values())) <= 1:
        return str(res["jobs"])
    return ", ".join(f"{label} {n}" for label, n in by.items())


def markdown(res: dict) -> str:
    from kernellab.bench import md_states

    lines = [f"# Throughput of `kernellab bench`: {' vs '.join(res['order'])} — {res['date']}", "",
             f"Command: `{res['command']}`", "",
             f"Device: {res['device']}; versions {json.dumps(res['versions'], sort_keys=True)}; "
             f"commit {res['commit']}.", "",
             f"Suite: {len(res['suite'])} problems (rule: per family the first by (level, number) whose reference "
             f"needs at most {res['max_ref_gb']:g} GB; quotas {json.dumps(QUOTA)}); side by side on "
             f"{len(res['problems'])}: {', '.join(r['name'] for r in res['problems'])}. Budget {res['budget']}, "
             f"--jobs {_jobs_text(res)}, limit {res['side_limit_s']:g} s per side"
             f"{', SMALL sizes' if res['small'] else ''}.", ""]
    left = [label for label in res["order"] if label not in res["sides"]]
    if left:
        lines += [f"**Written after the {', '.join(res['sides'])} side; {', '.join(left)} had not run: a page left so "
                  "means the run stopped before it.**", ""]
    if res["interpreted"]:
        lines += ["**Interpreted run (no CUDA device): the pipeline is exercised, the pace says nothing of a GPU.**", ""]
    lines += ["## Pace", "", "| side | commit | finished | wall s | problems/hour | evaluations | evaluations/GPU-hour | "
              "GPU busy share | mean GPU util % | stopped |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, s in res["sides"].items():
        lines.append(f"| {label} | {s['commit']} | {s['problems_finished']}/{s['problems']} | {_f(s['wall_s'])} | "
                     f"{_f(s['problems_per_hour'], '{:.2f}')} | {s['evaluations']} | {_f(s['evaluations_per_gpu_hour'])} | "
                     f"{_f(s['gpu_busy_share'], '{:.2f}')} | {_f(s['gpu_util_mean'])} | {s['stopped'] or '-'} |")
    hosts = [f"{label} {_f(s['host_least_available_gb'])} of {_f(s['host_total_gb'])}" for label, s in res["sides"].items()
             if s.get("host_total_gb") is not None]
    if hosts:
        floors = sorted({_f(s["host_floor_gb"]) for s in res["sides"].values() if s.get("host_floor_gb") is not None})
        lines += ["", f"Host memory, the least available while each side ran (GB): {'; '.join(hosts)}; a side is stopped "
                  f"below {' / '.join(floors)} GB."]
    c = res["comparison"]
    if c["problems_per_hour_ratio"] is not None:
        lines += ["", f"**Problems per hour, new / base: {c['problems_per_hour_ratio']:.2f}x.**"]
    for label, s in res["sides"].items():  # the bench's own sampler, where that side's bench files its samples
        states = md_states(s.get("bench_pace") or {})
        if states:
            lines += ["", f"## Where {label}'s GPU time went (the bench's own sampler)", "", *states[:-1]]
    phases = sorted({k for s in res["sides"].values() for k in s["phase_s"]},
                    key=lambda k: -max(s["phase_s"].get(k, 0.0) for s in res["sides"].values()))
    lines += ["", "## Seconds by sandbox phase and wait (summed over the evaluations)", "",
              "| phase | " + " | ".join(res["sides"]) + " |", "|---|" + "---|" * len(res["sides"])]
    for k in [*phases, "admission_wait"]:
        vals = [s["admission_wait_s"] if k == "admission_wait" else s["phase_s"].get(k) for s in res["sides"].values()]
        lines.append(f"| {k} | " + " | ".join(_f(v) for v in vals) + " |")
    waited = [(label, r) for label, s in res["sides"].items() for r in s.get("memory") or [] if r["admission_wait_s"] > 0]
    if waited:
        lines += ["", "## Memory admission by problem (the longest waits)", "",
                  "| side | problem | evaluations | admission wait s | largest need GB | largest job peak GB | "
                  "largest reserved GB | out-of-memory retries |", "|---|---|---|---|---|---|---|---|"]
        for label, r in sorted(waited, key=lambda lr: -lr[1]["admission_wait_s"])[:MEMORY_ROWS]:
            lines.append(f"| {label} | {r['problem']} | {r['evaluations']} | {r['admission_wait_s']:.1f} | "
                         f"{r['need_gb']:.1f} | {r['peak_gb']:.1f} | {_f(r.get('reserved_gb') or None)} | "
                         f"{r['oom_retries']} |")
    lines += ["", "## Verdicts per problem", ""]
    if c["agree"]:
        lines += [f"Both sides finished {c['agree']['judged']} problems; their correctness agrees on {c['agree']['agree']}.", ""]
    lines += ["| problem | " + " | ".join(f"{s} correct own-kernel winner | {s} winner (origin: action) | {s} vs eager" for s in res["sides"])
              + " | agree |", "|---|" + "---|---|---|" * len(res["sides"]) + "---|"]
    for r in c["rows"]:
        cells = []
        for label in res["sides"]:
            v = r.get(label)
            if v is None or not v["finished"]:
                cells += ["not finished", "-", "-"]
            else:
                cells += ["yes" if v["correct"] else "no",
                          f"{v['origin']}: {v['action']}" if v["correct"] and v["origin"] else "-",
                          _f(v["speedup_eager"], "{:.2f}x")]
        agree = "-" if r["agree"] is None else ("yes" if r["agree"] else "**no**")
        lines.append(f"| {r['problem']} | " + " | ".join(cells) + f" | {agree} |")
    lines += ["", "Databases: " + ", ".join(f"`{Path(s['db_gz']).name}`" for s in res["sides"].values() if s.get("db_gz")), ""]
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernelbench", default=str(DEFAULT_KB), help="KernelBench's folder (level1/, level2/) "
                    "[$KERNELBENCH_DIR or ../shared/kernelbench]")
    ap.add_argument("--base", default=DEFAULT_BASE, help="The base side's commit, checked out with git worktree [b1be0da]")
    ap.add_argument("--sides", default="base,new", help="Which sides, in order: base,new (default), new,base, new or base")
    ap.add_argument("--budget", type=int, default=4, help="Candidates per problem [4]")
    ap.add_argument("--jobs", type=int, default=4, help="Campaigns at once in each bench [4]")
    ap.add_argument("--base-jobs", type=int, default=None, metavar="N",
                    help="Campaigns at once in the base's bench, where its best pace needs another --jobs [--jobs]")
    ap.add_argument("--side-limit-s", type=float, default=1800.0,
                    help="Wall seconds per side; then SIGINT (SIGKILL 15 s later), its pace from what it finished [1800]")
    ap.add_argument("--host-floor-gb", type=float, default=None, metavar="G",
                    help="Stop a side (SIGKILL to its processes) when the host has less than G GB of memory available: "
                         "a host out of memory stops answering and loses the whole run [half the sandbox's floor]")
    ap.add_argument("--problems", type=int, default=None, metavar="N", help="The first N of the suite, one family at a time")
    ap.add_argument("--only", default=None, metavar="A,B", help="These problems of the suite (file stems)")
    ap.add_argument("--max-ref-gb", type=float, default=16.0, help="Leave out problems whose reference needs more [16]")
    ap.add_argument("--small", action="store_true", help="SMALL sizes (a CPU run of the pipeline: tests)")
    ap.add_argument("--bench-args", default="", metavar="'ARGS'", help="More options for each side's bench, e.g. --bench-args='--trials 2'")
    ap.add_argument("--out", default=str(RESULTS), help="Where the page and the gzipped databases go [experiments/results]")
    ap.add_argument("--pyspy-every", type=float, default=0.0, metavar="S",
                    help="Dump the bench process's Python stacks every S seconds with py-spy (PY_SPY, PATH or .whl/py-spy) "
                         "into <page>-<side>-pyspy.txt: where its threads wait [0: off]")
    ap.add_argument("--list", action="store_true", help="Print the suite (family, level, name, reference GB) and stop")
    args = ap.parse_args(argv)
    try:
        return _main(args, argv if argv is not None else sys.argv[1:])
    except ThroughputError as exc:
        print(f"bench_throughput: error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not sides or any(s not in ("new", "base") for s in sides) or len(set(sides)) != len(sides):
        raise ThroughputError(f"--sides {args.sides!r}: base and/or new, comma-separated")
    if args.budget < 1 or args.jobs < 1 or (args.base_jobs is not None and args.base_jobs < 1) or args.side_limit_s <= 0:
        raise ThroughputError("--budget, --jobs and --base-jobs must be at least 1, --side-limit-s above 0")
    if args.host_floor_gb is not None and args.host_floor_gb < 0:
        raise ThroughputError(f"--host-floor-gb {args.host_floor_gb:g}: at least 0 (0: never stop a side for memory)")
    kb = Path(args.kernelbench)
    suite = select_suite(kb, args.max_ref_gb)
    if args.list:
        for r in suite:
            print(f"{r['family']:<16} level{r['level']} {r['name']:<60} {_f(r['reference_gb'], '{:.2f}')} GB")
        return 0
    chosen = pick(suite, args.problems, [o.strip() for o in args.only.split(",") if o.strip()] if args.only else None)
    device, versions, gpus = _where()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc)
    stem = f"{stamp.strftime('%Y-%m-%d')}-{re.sub(r'[^a-z0-9]+', '-', device.lower()).strip('-')[:24]}-throughput"
    work = Path(tempfile.mkdtemp(prefix="kernellab-throughput-"))
    base_tree = None
    results: dict[str, dict] = {}
    failed = False
    try:
        suite_file = work / "suite.txt"
        suite_file.write_text("".join(f"{r['path']}\n" for r in chosen))
        trees = {"new": (ROOT, _commit_of_tree())}
        if "base" in sides:
            base_commit = _git("rev-parse", "--short=12", args.base + "^{commit}")
            base_tree = work / "base-tree"
            _git("worktree", "add", "--detach", str(base_tree), base_commit)
            trees["base"] = (base_tree, base_commit)
        jpath, mpath = out / f"{stem}.json", out / f"{stem}.md"
        for label in sides:
            tree, commit = trees[label]
            results[label] = run_side(label, tree, commit, suite_file, work, args, gpus,
                                      dump_to=out / f"{stem}-{label}-pyspy.txt")
            failed |= results[label]["failed"]
            results[label]["db_gz"] = str(gzip_db(Path(results[label]["db"]), out / f"{stem}-{label}.db.gz"))
            # the page after each side, not only at the end: a run cut off in its second side keeps the first
            res = {"date": stamp.isoformat(timespec="seconds"), "device": device, "gpus": gpus,
                   "interpreted": gpus == 0, "versions": versions, "commit": trees["new"][1],
                   "command": "python experiments/bench_throughput.py " + " ".join(shlex.quote(a) for a in argv),
                   "order": sides, "sides_run": list(results), "budget": args.budget, "jobs": args.jobs,
                   "jobs_by_side": {label: side_jobs(label, args) for label in sides},
                   "side_limit_s": args.side_limit_s, "host_floor_gb": args.host_floor_gb, "small": args.small,
                   "max_ref_gb": args.max_ref_gb, "quota": QUOTA, "suite": suite, "problems": chosen,
                   "sides": results, "comparison": compare(results)}
            jpath.write_text(json.dumps(res, indent=2, default=str))
            mpath.write_text(markdown(res))
        print(f"bench_throughput: {mpath} and {jpath}", file=sys.stderr)
    finally:
        if base_tree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)],
                           capture_output=True, timeout=120)
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
