"""A problem the sandbox finds at fault (issue 34: every trial uninformative, seen only at the size the
campaign judges at, e.g. full size on a GPU) stops at its first such evaluation, with the reason; no
budget goes to candidates that can never be correct, and `run` exits 2 (bad input)."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernellab
from kernellab.cli import _finish
from kernellab.store import Store

ONE_CHANNEL = Path(__file__).resolve().parents[1] / "sandbox" / "problems" / "one_channel_groups.py"


def test_problem_fault_stops_the_problem(tmp_path: Path) -> None:
    # small=False: full size on the CPU, which check_campaign does not try (as on a GPU)
    out = kernellab.run(str(ONE_CHANNEL), db=str(tmp_path / "k.db"), budget=4, width=1, trials=2, device="cpu",
                        small=False)
    assert not out["best"]
    reason = out["stops"]["one_channel_groups"]
    assert reason.startswith("the problem itself is at fault: ") and "uninformative" in reason, reason
    assert out["candidates"] == 1, out  # stopped after the first: the debugger was not asked to fix it
    # what `kernellab run` does with this summary (on the CPU check_campaign refuses such a file first)
    store = Store(tmp_path / "k.db")
    with pytest.raises(SystemExit) as exit_:
        _finish(store.summary(out["campaign"]["id"]), True, store)
    store.close()
    assert exit_.value.code == 2
