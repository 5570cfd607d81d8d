"""The sizes a problem is judged at are shown (issue 34: a derived small instance of one channel per
group passed all-zeros outputs, and nothing printed the sizes): in the run's first lines, in `show`,
in the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kernellab.store import Store

PROBLEM = Path(__file__).resolve().parents[1] / "problems" / "kb_gemm_add_relu.py"  # no SMALL: derived
SIZES = "small instance batch_size=8, in_features=8, out_features=8 (derived from the file's size constants)"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernellab.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def test_sizes_in_run_show_and_report(tmp_path: Path) -> None:
    r = _cli("run", str(PROBLEM), "--budget", "1", "--device", "cpu", "--db", "k.db", "--campaign", "c", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    first = r.stderr.splitlines()[:2]
    assert any(line.endswith(f"kb_gemm_add_relu: {SIZES}") for line in first), r.stderr
    store = Store(tmp_path / "k.db")
    cid = store.get_campaign("c")["id"]
    cand = store.candidates(cid)[0]
    # the start-up, in the order it ran: the workers were started once the input was checked, before the campaign
    # was written and the graph's modules loaded (their start-up overlaps those)
    ages = next(e["payload"]["startup_age_s"] for e in store.events(cid, "session") if e["payload"].get("started"))
    order = ["imported", "checked", "warmed", "started", "entered", "session"]
    assert [ages[k] for k in order] == sorted(ages[k] for k in order), ages
    store.close()
    shown = _cli("show", cand["id"], "--db", "k.db", "--no-source", "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["problem"]["instances"] == [SIZES]
    assert _cli("report", "c", "--db", "k.db", "-o", "r.html", cwd=tmp_path).returncode == 0
    html = (tmp_path / "r.html").read_text()
    assert '<p class="instance">' + SIZES.replace("'", "&#x27;") + "</p>" in html
