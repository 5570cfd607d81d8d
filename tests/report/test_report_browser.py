"""The report in a real browser: headless Chromium loads it with every outside host unreachable,
runs its scripts with no error, shows every section; a screenshot is kept under test-artifacts/."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_campaign import ROOT, build_campaign

from kernellab.cli import main
from kernellab.report import SECTIONS
from kernellab.store import Store

ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium; installed with apt-get where missing (CI runs as root)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.skip("chromium is missing and cannot be installed here (needs apt-get as root)")
    log = ""
    for cmd in ([apt, "install", "-y", "-q", "chromium"], [apt, "update", "-q"], [apt, "install", "-y", "-q", "chromium"]):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                                  env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        except subprocess.TimeoutExpired:
            pytest.skip(f"installing chromium timed out: {' '.join(cmd)}")
        log += proc.stdout[-500:] + proc.stderr[-500:]
        if shutil.which("chromium"):
            return shutil.which("chromium")
    pytest.skip(f"chromium could not be installed with apt-get: {log[-800:]}")


def _browse(chromium: str, page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--no-first-run", "--disable-sync", f"--user-data-dir={profile}",
           # every host name fails to resolve: a report that fetched anything would log an error
           "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0", *extra, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


class _Dom(HTMLParser):
    """Sections per problem (with how many svg/table/p elements each holds) and the error sink."""

    def __init__(self) -> None:
        super().__init__()
        self.problem: str | None = None
        self.section: tuple[str | None, str] | None = None
        self.content: dict[tuple[str | None, str], int] = {}
        self.errors: str | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "article":
            self.problem = a.get("data-problem")
        elif tag == "section":
            self.section = (self.problem if a["data-section"] in SECTIONS else None, a["data-section"])
            self.content[self.section] = 0
        elif tag in ("svg", "table", "p", "div") and self.section is not None:
            self.content[self.section] += 1
        if a.get("id") == "kl-errors":
            self.errors = a.get("data-count")

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.section = None


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.mark.parametrize("interpreted", [False, True], ids=["gpu-campaign", "interpreted-campaign"])
def test_report_loads_in_chromium_with_every_section(chromium: str, tmp_path: Path, interpreted: bool) -> None:
    db = tmp_path / "k.db"
    with Store(db) as s:
        build_campaign(s, "browser", interpreted=interpreted)
        problems = sorted({s.get_problem(c["problem_id"])["name"] for c in s.candidates(s.get_campaign("browser")["id"])})
    page = tmp_path / "report.html"
    res = CliRunner().invoke(main, ["report", "browser", "--db", str(db), "-o", str(page)])
    assert res.exit_code == 0, res.output

    dump = _browse(chromium, page, tmp_path / "profile", "--dump-dom")
    assert dump.returncode == 0, dump.stderr[-2000:]
    assert not _console(dump.stderr), _console(dump.stderr)
    dom = _Dom()
    dom.feed(dump.stdout)
    assert dom.errors == "0", f"script errors while loading: {dump.stdout[-1000:]}"  # -1 = the script never ran
    for name in problems:
        for sec in SECTIONS:
            assert dom.content.get((name, sec), 0) > 0, f"section {sec} of {name} missing or empty"
    assert dom.content.get((None, "summary"), 0) > 0 and dom.content.get((None, "llm"), 0) > 0

    ARTIFACTS.mkdir(exist_ok=True)
    name = "report-interpreted" if interpreted else "report"
    shot = ARTIFACTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    snap = _browse(chromium, page, tmp_path / "profile", "--hide-scrollbars", "--window-size=1280,4800",
                   f"--screenshot={shot}")
    assert snap.returncode == 0, snap.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    shutil.copy(page, ARTIFACTS / f"{name}.html")


def test_the_harness_sees_script_errors(chromium: str, tmp_path: Path) -> None:
    """The checks above could fail: a page with a throwing script is caught by both of them."""
    db = tmp_path / "k.db"
    with Store(db) as s:
        build_campaign(s, "broken")
    page = tmp_path / "report.html"
    assert CliRunner().invoke(main, ["report", "broken", "--db", str(db), "-o", str(page)]).exit_code == 0
    html = page.read_text()
    page.write_text(re.sub(r"(<body[^>]*>)", r"\1<script>no_such_function();</script>", html, count=1))
    dump = _browse(chromium, page, tmp_path / "profile", "--dump-dom")
    dom = _Dom()
    dom.feed(dump.stdout)
    assert dom.errors == "1"
    assert any("no_such_function" in line for line in _console(dump.stderr))
