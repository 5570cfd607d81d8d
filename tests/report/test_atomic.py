"""Report and export files are written atomically: a reader sees the old file or the new one."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from report_campaign import build_campaign

from kernellab import export, fileio, report
from kernellab.store import Store


def _boom(*a, **k):
    raise OSError("disk full (simulated at the rename)")


def test_write_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "sub" / "r.html"
    assert fileio.write_atomic(out, "one") == out and out.read_text() == "one"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    out.chmod(0o600)
    fileio.write_atomic(out, "two")
    assert out.read_text() == "two" and stat.S_IMODE(out.stat().st_mode) == 0o600  # the mode is kept
    monkeypatch.setattr(fileio.os, "replace", _boom)
    with pytest.raises(OSError, match="disk full"):
        fileio.write_atomic(out, "three")
    assert out.read_text() == "two" and os.listdir(out.parent) == ["r.html"]  # no temp file left


def test_report_and_export_go_through_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(tmp_path / "k.db")
    cid = build_campaign(store)
    pid = store.candidates(cid)[0]["problem_id"]
    html, py = tmp_path / "r.html", tmp_path / "best.py"
    report.write(store, cid, html)
    export.export(store, cid, pid, py)
    old = html.read_text(), py.read_text()
    assert old[0].rstrip().endswith("</html>")
    monkeypatch.setattr(fileio.os, "replace", _boom)
    with pytest.raises(OSError):
        report.write(store, cid, html)
    with pytest.raises(OSError):
        export.export(store, cid, pid, py)
    assert (html.read_text(), py.read_text()) == old
    store.close()
