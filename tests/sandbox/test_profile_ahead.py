"""Nsight Compute's targets on the CPU: a gated process's set-up holds nothing of the GPU, and a target started
ahead of its job (``WarmTargets``) waits for it holding nothing, then profiles it as a cold one would. ncu itself
runs in the GPU tests (tests/sandbox/test_gpu.py); here the target runs without it, on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from kernellab.sandbox._api import ProfileGate
from kernellab.sandbox._gpu import Board, RWLock
from kernellab.sandbox._profile import WarmTargets, _follow, hand_job, run_gated
from kernellab.sandbox._profile_target import GATE_SHARE, JOB, PARENT_ENV, TARGET_STEPS

ROOT = Path(__file__).resolve().parents[2]
RELU = (Path(__file__).resolve().parent / "adversarial" / "correct_torch.py").read_text()
CPU_ENV = {"KERNELLAB_SANDBOX_DEVICE": "cpu", "TRITON_INTERPRET": "1"}


def _target(d: Path) -> list[str]:
    return [sys.executable, "-m", "kernellab.sandbox._profile_target", str(d)]


def _until(pred, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _steps(d: Path) -> dict:
    try:
        return json.loads((d / TARGET_STEPS).read_text())
    except (OSError, ValueError):
        return {}


def test_a_gated_process_wraps_its_compilers_before_it_asks_for_the_share(tmp_path):
    # wrapping the compilers imports Inductor, Triton and CuPy: 5.9 s of a solo profile's 7.2 s under the share on
    # the H200, every timing arriving meanwhile waiting it out
    gate = ProfileGate("0", RWLock())
    script = textwrap.dedent(f"""
        import pathlib
        import kernellab.sandbox._compilers as c
        from kernellab.sandbox._profile_target import GATE_SHARED, gated_share
        d = pathlib.Path({str(tmp_path)!r})
        orig = c.release_for_compiles
        def wrap(*a):
            assert not (d / GATE_SHARED).exists(), "the compilers were wrapped under the share"
            return orig(*a)
        c.release_for_compiles = wrap
        assert gated_share(d, "cpu").shared
    """)
    run = run_gated([sys.executable, "-c", script], tmp_path, {**os.environ, "TRITON_INTERPRET": "1"}, 120.0, gate)
    gate.close()
    assert run.returncode == 0, run.stderr


def test_a_target_started_ahead_holds_nothing_until_its_job_then_profiles_it(problem):
    lock = RWLock()
    targets = WarmTargets(command=_target, env=CPU_ENV)
    targets.start("0")
    try:
        t = targets._ready["0"][0]
        _until(lambda: "context" in _steps(t.jobdir) or t.proc.poll() is not None)
        time.sleep(0.5)
        # set up, waiting for its job: no share asked for, the GPU's lock untouched
        assert t.proc.poll() is None, t.err.seek(0) or t.err.read()
        assert not (t.jobdir / GATE_SHARE).exists() and lock.state == (0, False, 0)
        got = targets.take("0")
        assert got is t and targets.alive("0") == 1  # its replacement starts at once
        hand_job(t.jobdir, {"problem": problem("tiny_relu"), "source": RELU, "config": None, "small": True})
        gate = ProfileGate("0", lock, Board())
        run = _follow(t, 180.0, gate)
        gate.close()
        assert run.returncode == 0, run.stderr
        steps = _steps(t.jobdir)
        assert list(steps)[:3] == ["context", "idle", "share"] and "forward2" in steps, steps
        # the share was asked for after the job arrived, and the profiled forward ran alone
        assert (t.jobdir / GATE_SHARE).stat().st_mtime_ns >= (t.jobdir / JOB).stat().st_mtime_ns
        assert {"start", "warm", "alone"} <= set(gate.seconds) and lock.state == (0, False, 0), gate.seconds
        t.close()
        assert not t.jobdir.exists()
        spare = targets._ready["0"][0]
    finally:
        targets.close()
    assert spare.proc.poll() is not None and not spare.jobdir.exists()  # close ends the targets not taken


def test_a_target_started_ahead_ends_when_its_parent_is_gone():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    targets = WarmTargets(command=_target, env={**CPU_ENV, PARENT_ENV: str(gone.pid)})
    targets.start("0")
    t = targets._ready["0"][0]
    try:
        t.proc.wait(timeout=180)
        t.err.seek(0)
        assert t.proc.returncode != 0 and "parent is gone" in t.err.read()
        assert targets.take("0") is None  # a target that ended is not handed over
    finally:
        targets.close()
