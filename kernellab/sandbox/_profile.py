"""Nsight Compute metrics of a candidate's kernels: ``ncu --clock-control none`` in its own process.

The target process (``python -m kernellab.sandbox._profile_target JOBDIR``) builds the problem and the
candidate, runs the forward twice to compile, then runs one forward between
``cudaProfilerStart/Stop`` (ncu runs with ``--profile-from-start off``), so only that forward's
kernels are profiled. Clocks are left alone (``--clock-control none``) so that the numbers match
what the timing saw. Where ncu is missing or lacks counter permission we say so once and return an
empty result carrying the reason.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernellab.problem import Problem

from ._env import worker_env
from ._profile_target import (
    AHEAD_ENV,
    GATE_DONE,
    GATE_ENV,
    GATE_GO,
    GATE_OFF,
    GATE_ON,
    GATE_ON_GRANTED,
    GATE_READY,
    GATE_SHARE,
    GATE_SHARED,
    JOB,
    PARENT_ENV,
    TARGET_STEPS,
)

log = logging.getLogger("kernellab.sandbox")

# ncu metric -> our name. Kept to metrics present on Ampere and Hopper; one ncu rejects is dropped
# (and listed in ``ProfileResult.dropped``) rather than losing the whole profile.
METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__shared_mem_per_block_static": "smem_static_bytes_per_block",
    "launch__shared_mem_per_block_dynamic": "smem_dynamic_bytes_per_block",
    "smsp__sass_inst_executed_op_local_ld.sum": "local_load_instructions",
    "smsp__sass_inst_executed_op_local_st.sum": "local_store_instructions",
    "l1tex__t_sector_hit_rate.pct": "l1_hit_rate_pct",
    "lts__t_sector_hit_rate.pct": "l2_hit_rate_pct",
    "dram__bytes_read.sum": "dram_bytes_read",
    "dram__bytes_write.sum": "dram_bytes_write",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": "fp32_fma_thread_ops",
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": "fp32_add_thread_ops",
    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum": "fp32_mul_thread_ops",
    "sm__inst_executed_pipe_tensor.sum": "tensor_pipe_instructions",
}
STALLS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle", "long_scoreboard",
          "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction", "not_selected", "selected",
          "short_scoreboard", "sleeping", "tex_throttle", "wait")
for _r in STALLS:
    METRICS[f"smsp__average_warps_issue_stalled_{_r}_per_issue_active.ratio"] = f"stall_{_r}"
TOP_STALLS = 3

# Measured ceilings of the reference GPU (an H200; kernellab.report.CEILINGS): copy bandwidth (read+write) and cuBLAS fp32.
CEILING_BW_TBS = 4.22
CEILING_FP32_TFLOPS = 51.0

_warned: set[str] = set()


class ProfileResult(list):
    """A list of ``(kernel, metric, value)``; ``reason`` says why it is empty, ``dropped`` lists ncu
    metrics this ncu did not know."""

    def __init__(self, rows: list | None = None, reason: str | None = None, dropped: list | None = None,
                 seconds: dict | None = None) -> None:
        super().__init__(rows or [])
        self.reason = reason
        self.dropped = dropped or []
        # where the run's wall time went (gated runs): start-up holding nothing, warm-up sharing the GPU, the
        # profiled forward alone, the rest (ncu writing its report), and reading the report back
        self.seconds = seconds or {}


def _say_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        log.warning("kernellab.sandbox.profile: %s; continuing without Nsight Compute metrics", reason)


def _find_ncu(ncu: str | None) -> str | None:
    if ncu:
        return ncu if Path(ncu).exists() or shutil.which(ncu) else None
    found = shutil.which("ncu")
    if found:
        return found
    for p in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu"):
        if Path(p).exists():
            return p
    return None


def _ncu_cmd(exe: str, metrics: dict[str, str], jobdir: Path) -> list[str]:
    return [exe, "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
            "--metrics", ",".join(metrics), "-f", "-o", str(jobdir / "report"),
            sys.executable, "-m", "kernellab.sandbox._profile_target", str(jobdir)]


class _Launched:
    """One gated process started (``Popen``), its output in temporary files, and its job directory (removed by
    :meth:`close`)."""

    def __init__(self, cmd: list[str], jobdir: Path, env: dict, owns_dir: bool = False) -> None:
        self.cmd, self.jobdir, self.owns_dir = cmd, jobdir, owns_dir
        self.out, self.err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        # its own session: WarmTargets.close ends ncu and its target together (os.killpg)
        self.proc = subprocess.Popen(cmd, cwd=jobdir, env=env, stdout=self.out, stderr=self.err, text=True,
                                     start_new_session=True)

    def signal_kill(self) -> None:
        """SIGKILL to ncu and its target (their own process group), not waited for."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.signal_kill()
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        self.out.close()
        self.err.close()
        if self.owns_dir:
            shutil.rmtree(self.jobdir, ignore_errors=True)


class WarmTargets:
    """Nsight Compute runs started ahead of their jobs, ``per_gpu`` ready for each GPU: ncu's start, the
    target's imports, its CUDA context and the compilers' imports (4-11 s on the H200, nothing of the GPU held)
    are behind a profile when it begins, and its job (``job.pkl``) is all it waits for
    (``_profile_target.await_job``). :meth:`take` hands one over and starts its replacement. Each is used once:
    the candidate's code runs in a process of its own, as a cold profile's does. ``command`` (default: ncu with
    :data:`METRICS`) makes a target's command line from its job directory (``_command`` None: ncu is not found);
    ``env`` is added to each target's environment."""

    def __init__(self, per_gpu: int = 1, ncu: str | None = None,
                 command: Callable[[Path], list[str]] | None = None, env: dict[str, str] | None = None) -> None:
        self.per_gpu, self.env = per_gpu, dict(env or {})
        exe = _find_ncu(ncu) if command is None else None
        self.metrics = dict(METRICS)
        self._command = command or ((lambda d: _ncu_cmd(exe, self.metrics, d)) if exe else None)
        self._ready: dict[str, list[_Launched]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def start(self, gpu: str) -> None:
        """Start targets for ``gpu`` until ``per_gpu`` are there (nothing where ncu is missing)."""
        if self._command is None:
            return
        with self._lock:
            if self._closed:
                return
            ready = self._ready.setdefault(gpu, [])
            for t in [t for t in ready if t.proc.poll() is not None]:  # one that died idle: replaced
                ready.remove(t)
                t.close()
            while len(ready) < self.per_gpu:
                ready.append(_launch(self._command, gpu, {GATE_ENV: "1", AHEAD_ENV: "1",
                                                          PARENT_ENV: str(os.getpid()), **self.env}))

    def take(self, gpu: str, metrics: dict[str, str] | None = None) -> _Launched | None:
        """A target started for ``gpu`` that still runs (with ``metrics``, where given), or None; its
        replacement starts."""
        with self._lock:
            ready = self._ready.get(gpu, [])
            got = None
            while ready and got is None:
                t = ready.pop(0)
                if t.proc.poll() is None and (metrics is None or metrics == self.metrics):
                    got = t
                else:
                    t.close()
        self.start(gpu)  # the next one sets up while this one runs
        return got

    def alive(self, gpu: str) -> int:
        with self._lock:
            return sum(1 for t in self._ready.get(gpu, []) if t.proc.poll() is None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ready = [t for ts in self._ready.values() for t in ts]
            self._ready.clear()
        for t in ready:
            t.signal_kill()
        for t in ready:
            t.close()


def _launch(command: Callable[[Path], list[str]], gpu: str, extra: dict[str, str], job: dict | None = None) -> _Launched:
    """A target's process started in a job directory of its own, seeing ``gpu`` only, with the worker's scrubbed
    environment plus ``extra`` (the interpreter switch dropped unless ``extra`` sets it); ``job`` is handed over
    before it starts, where given (a target started ahead gets it later: :func:`hand_job`)."""
    jobdir = Path(tempfile.mkdtemp(prefix="kernellab-ncu-"))
    if job is not None:
        hand_job(jobdir, job)
    env = worker_env(str(jobdir), {"CUDA_VISIBLE_DEVICES": gpu, **extra})
    if "TRITON_INTERPRET" not in extra:
        env.pop("TRITON_INTERPRET", None)
    return _Launched(command(jobdir), jobdir, env, owns_dir=True)


def hand_job(jobdir: Path, job: dict) -> None:
    """``job`` into ``jobdir`` whole: written aside, then renamed into place (a target started ahead waits for
    the name)."""
    tmp = jobdir / (JOB + ".part")
    tmp.write_bytes(pickle.dumps(job))
    os.replace(tmp, jobdir / JOB)


def profile(problem: Problem, source: str, config: dict | None = None, *, small: bool = False,
            gpu: str | None = None, timeout: float = 600.0, ncu: str | None = None, gate: Any = None) -> ProfileResult:
    """Profile one forward of the candidate with Nsight Compute; per-kernel rows
    ``(kernel, metric, value)`` plus derived ``achieved_bandwidth_tbs``, ``bandwidth_pct_of_ceiling``,
    ``achieved_fp32_tflops``, ``fp32_pct_of_ceiling`` and ``top_stall_<k>_<reason>`` rows.
    ``gate`` (a :class:`~kernellab.sandbox._api.ProfileGate`, shared when given): the target waits
    for it before the profiled forward, which ``gate.exclusive()`` covers; without it the caller holds
    the GPU alone for the whole run. A gate's ``targets`` (:class:`WarmTargets`) hands over a target started
    ahead, where one is ready for this GPU (``seconds.ahead``: 1)."""
    exe = _find_ncu(ncu)
    if exe is None:
        reason = "ncu (Nsight Compute) was not found on PATH"
        _say_once(reason)
        return ProfileResult(reason=reason)
    from kernellab.env import has_cuda

    if not has_cuda():
        reason = "no CUDA device: Nsight Compute needs one"
        _say_once(reason)
        return ProfileResult(reason=reason)
    metrics = dict(METRICS)
    dropped: list[str] = []
    job = {"problem": problem, "source": source, "config": config, "small": small}
    gpu = gpu or os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    targets = getattr(gate, "targets", None) if gate is not None and ncu is None else None
    launched: _Launched | None = None
    try:
        for attempt in range(4):
            ahead = targets.take(gpu, metrics) if targets is not None and attempt == 0 else None
            if ahead is not None:
                launched = ahead
                hand_job(launched.jobdir, job)
            else:
                launched = _launch(lambda d: _ncu_cmd(exe, metrics, d), gpu,
                                   {GATE_ENV: "1"} if gate is not None else {}, job)
            try:
                run = _follow(launched, timeout, gate)
            except subprocess.TimeoutExpired:
                return ProfileResult(reason=f"ncu did not finish within {timeout:g} s", dropped=dropped)
            out = run.stdout + run.stderr
            if "ERR_NVGPUCTRPERM" in out or "permission" in out.lower() and "counter" in out.lower():
                reason = "ncu lacks permission to read GPU performance counters (ERR_NVGPUCTRPERM)"
                _say_once(reason)
                return ProfileResult(reason=reason, dropped=dropped)
            rep = launched.jobdir / "report"
            unknown = [m for m in metrics if m in out and re.search(r"metric", out, re.I)] if run.returncode else []
            if unknown and not Path(f"{rep}.ncu-rep").exists():
                for m in unknown:
                    metrics.pop(m)
                dropped.extend(unknown)
                if targets is not None:  # the targets started later ask this ncu for what it knows
                    targets.metrics = dict(metrics)
                launched.close()
                continue
            break
        rep_file = Path(f"{rep}.ncu-rep")
        if not rep_file.exists():
            return ProfileResult(reason=f"ncu produced no report (exit {run.returncode}): {out[-1500:]}",
                                 dropped=dropped)
        t_imp = time.monotonic()
        imp = subprocess.run([exe, "--import", str(rep_file), "--csv", "--page", "raw", "--print-units", "base"],
                             capture_output=True, text=True, timeout=timeout)
        seconds = {**(getattr(gate, "seconds", None) or {}), "import": round(time.monotonic() - t_imp, 3)}
        if ahead is not None:
            seconds["ahead"] = 1
        with contextlib.suppress(OSError, ValueError):  # the target's own steps up to its warm state
            seconds["target"] = json.loads((launched.jobdir / TARGET_STEPS).read_text())
    finally:
        if launched is not None:
            launched.close()
    rows = parse_raw_csv(imp.stdout, metrics)
    if not rows:
        return ProfileResult(reason=f"no kernels in the ncu report: {(imp.stdout + imp.stderr)[-1500:]}",
                             dropped=dropped, seconds=seconds)
    return ProfileResult(rows, dropped=dropped, seconds=seconds)


def run_gated(cmd: list[str], jobdir: Path, env: dict, timeout: float, gate: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` of a process that uses the GPU (ncu and its target, the Inductor seed's compile); with a
    ``gate``, nothing is held while the process starts, the GPU is shared (``gate.share()``) from its "share"
    file (:func:`kernellab.sandbox._profile_target.ask`) and held alone (``gate.exclusive()``) from its "warm"
    file to its "done" file (or its end); a process that never asks to be alone shares it to its end; the
    caller's gate releases the share (``ProfileGate.close``). While shared, the process may give the share up for
    host-only work and ask for it again (:class:`kernellab.sandbox._profile_target.GpuHold`: its numbered "off"
    and "on" files). The process learns it is gated from ``GATE_ENV``."""
    if gate is None:
        return subprocess.run(cmd, cwd=jobdir, env=env, capture_output=True, text=True, timeout=timeout)
    launched = _Launched(cmd, jobdir, {**env, GATE_ENV: "1"})  # the process asks (``ask``) before it uses the GPU
    try:
        return _follow(launched, timeout, gate)
    finally:
        launched.close()


def _follow(launched: _Launched, timeout: float, gate: Any) -> subprocess.CompletedProcess:
    """:func:`run_gated`'s side of a started process, to its end (killed past ``timeout`` or on an exception);
    without a gate, only waited for."""
    proc, cmd, jobdir = launched.proc, launched.cmd, launched.jobdir
    t = time.monotonic()
    until = t + timeout
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        nonlocal t
        now = time.monotonic()
        marks[name] = round(marks.get(name, 0.0) + now - t, 3)
        t = now

    try:
        if gate is None:
            _wait(proc, cmd, until)
        else:
            if _wait(proc, cmd, until, jobdir / GATE_SHARE):
                mark("start")
                gate.share()
                mark("wait_share")
                (jobdir / GATE_SHARED).touch()
            k = 0
            # shared until the process is warm (or ends), but for each host-only stretch it announces
            while (_wait(proc, cmd, until, jobdir / GATE_READY, jobdir / GATE_OFF.format(k))
                   and not (jobdir / GATE_READY).exists()):
                mark("shared")
                gate.unshare()
                if not _wait(proc, cmd, until, jobdir / GATE_ON.format(k)):
                    break
                mark("off")
                gate.share()
                mark("wait_share")
                (jobdir / GATE_ON_GRANTED.format(k)).touch()
                k += 1
            if proc.poll() is None and (jobdir / GATE_READY).exists():
                mark("warm")
                with gate.exclusive():
                    mark("wait_alone")
                    (jobdir / GATE_GO).touch()
                    _wait(proc, cmd, until, jobdir / GATE_DONE)
                    mark("alone")
            _wait(proc, cmd, until)
            mark("report")
    finally:
        if gate is not None and hasattr(gate, "seconds"):
            gate.seconds.update(marks)
        launched.kill()  # timed out, or interrupted: no-op once it ended
    launched.out.seek(0)
    launched.err.seek(0)
    return subprocess.CompletedProcess(cmd, proc.returncode, launched.out.read(), launched.err.read())


def _wait(proc: subprocess.Popen, cmd: list[str], until: float, *markers: Path) -> bool:
    """Poll until the process ends or one of ``markers`` exists; whether it still runs. ``TimeoutExpired`` past
    ``until``."""
    while proc.poll() is None and not any(m.exists() for m in markers):
        if time.monotonic() > until:
            raise subprocess.TimeoutExpired(cmd, 0)
        time.sleep(0.01)
    return proc.poll() is None


def parse_raw_csv(text: str, metrics: dict[str, str]) -> list[tuple[str, str, float]]:
    """Rows ``(kernel, metric, value)`` from ``ncu --csv --page raw`` output, with derived metrics.
    Kernels launched more than once get an index suffix (``name#1``)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    reader = list(csv.reader(io.StringIO("\n".join(lines))))
    header = reader[0]
    try:
        name_col = header.index("Kernel Name")
        id_col = header.index("ID")
    except ValueError:
        return []
    out: list[tuple[str, str, float]] = []
    seen: dict[str, int] = {}
    for row in reader[1:]:
        if len(row) != len(header) or not row[id_col].strip().isdigit():
            continue  # the units row
        kname = row[name_col][:200]
        k = seen.get(kname, 0)
        seen[kname] = k + 1
        label = kname if k == 0 else f"{kname}#{k}"
        vals: dict[str, float] = {}
        for col, raw in zip(header, row, strict=False):
            if col in metrics:
                try:
                    vals[metrics[col]] = float(raw.replace(",", ""))
                except ValueError:
                    continue
        out.extend((label, n, v) for n, v in sorted(vals.items()))
        out.extend((label, n, v) for n, v in derive(vals))
    return out


def derive(v: dict[str, float]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    ns = v.get("duration_ns")
    if ns and ns > 0:
        if "dram_bytes_read" in v or "dram_bytes_write" in v:
            tbs = (v.get("dram_bytes_read", 0.0) + v.get("dram_bytes_write", 0.0)) / ns / 1e3
            out += [("achieved_bandwidth_tbs", tbs), ("bandwidth_pct_of_ceiling", 100 * tbs / CEILING_BW_TBS)]
        if "fp32_fma_thread_ops" in v:
            flops = 2 * v["fp32_fma_thread_ops"] + v.get("fp32_add_thread_ops", 0.0) + v.get("fp32_mul_thread_ops", 0.0)
            tf = flops / ns / 1e3
            out += [("achieved_fp32_tflops", tf), ("fp32_pct_of_ceiling", 100 * tf / CEILING_FP32_TFLOPS)]
    stalls = sorted(((n[6:], x) for n, x in v.items() if n.startswith("stall_")), key=lambda kv: -kv[1])
    for i, (reason, x) in enumerate(stalls[:TOP_STALLS], 1):
        out.append((f"top_stall_{i}_{reason}", x))
    return out
