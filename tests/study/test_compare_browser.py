"""The compare page in headless Chromium, every outside host unreachable: it loads with no script
error and every section shows its plots or tables (as tests/report checks the campaign report)."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from study_store import PROBLEMS, SEEDS, add_run

from kernellab.compare import SECTIONS, compare, write_html
from kernellab.store import Store

ROOT = Path(__file__).resolve().parents[2]


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.section: str | None = None
        self.content: dict[str, dict[str, int]] = {}
        self.errors: str | None = None
        self.fetches: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "section":
            self.section = a.get("data-section")
            self.content[self.section] = {}
        elif self.section is not None and tag in ("svg", "table", "li", "p"):
            self.content[self.section][tag] = self.content[self.section].get(tag, 0) + 1
        if a.get("id") == "kl-errors":
            self.errors = a.get("data-count")
        if tag in ("img", "script", "link", "iframe") and (a.get("src") or a.get("href")):
            self.fetches.append(a.get("src") or a.get("href"))

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.section = None


def test_compare_page_loads_in_chromium_with_every_section(tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (tests/report/test_report_browser.py installs it where it can)")
    db = tmp_path / "k.db"
    with Store(db) as s:
        for i, prob in enumerate(PROBLEMS):
            for seed in SEEDS:
                add_run(s, f"g-{i}-{seed}", prob, policy="greedy", seed=seed,
                        values=[{"speedup": 1.1}, {"speedup": 1.4 + 0.1 * i + 0.05 * seed}])
                add_run(s, f"b-{i}-{seed}", prob, policy="beam", seed=seed,
                        values=[{"status": "timeout", "error_class": "timeout"}, {"speedup": 1.3 + 0.1 * i}])
        page = write_html(compare(s, campaigns=[c["name"] for c in s.list_campaigns()], n_boot=500),
                          tmp_path / "compare.html")
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--no-first-run", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()]
    dump = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert dump.returncode == 0, dump.stderr[-2000:]
    console = [line for line in dump.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    dom = _Dom()
    dom.feed(dump.stdout)
    assert dom.errors == "0", dump.stdout[-1000:]  # -1: the page's script never ran
    assert not dom.fetches, dom.fetches  # self-contained: nothing to load from anywhere
    assert list(dom.content) == list(SECTIONS)
    for name, found in dom.content.items():
        assert found.get("svg", 0) + found.get("table", 0) + found.get("li", 0) > 0, f"section {name} is empty"
    assert dom.content["curves"]["svg"] == 3 and dom.content["failures"]["svg"] == 1
    assert dom.content["matrix"]["table"] == 2 and dom.content["strategies"]["table"] == 1

    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    shot = artifacts / "compare.png"
    shot.unlink(missing_ok=True)
    snap = subprocess.run(cmd[:-2] + ["--hide-scrollbars", "--window-size=1200,3600", f"--screenshot={shot}",
                                      page.as_uri()], capture_output=True, text=True, timeout=90)
    assert snap.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", snap.stderr[-2000:]
    shutil.copy(page, artifacts / "compare.html")
