"""The HTML report: every section per problem, numbers read from the store, no network, honest
about interpreted timings, graceful without metrics."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_campaign import build_campaign

from kernellab.cli import main
from kernellab.report import SECTIONS, render
from kernellab.store import Store, StoreError


class _Sections(HTMLParser):
    """Collects (problem, section) pairs and counts tree nodes per problem."""

    def __init__(self) -> None:
        super().__init__()
        self.problem: str | None = None
        self.sections: set[tuple[str | None, str]] = set()
        self.nodes: dict[str | None, int] = {}
        self.svgs = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "article" and "data-problem" in a:
            self.problem = a["data-problem"]
        if tag == "section":
            self.sections.add((self.problem if a["data-section"] in SECTIONS else None, a["data-section"]))
        if tag == "circle" and a.get("class") == "kl-node":
            self.nodes[self.problem] = self.nodes.get(self.problem, 0) + 1
        if tag == "svg":
            self.svgs += 1


def _parse(html: str) -> _Sections:
    p = _Sections()
    p.feed(html)
    return p


def test_every_section_and_numbers_from_the_store(store: Store) -> None:
    cid = build_campaign(store)
    html = render(store, cid)
    parsed = _parse(html)
    names = [store.get_problem(pid)["name"] for pid in dict.fromkeys(c["problem_id"] for c in store.candidates(cid))]
    assert len(names) == 2
    for name in names:
        for sec in SECTIONS:
            assert (name, sec) in parsed.sections, (name, sec)
    assert (None, "summary") in parsed.sections and (None, "llm") in parsed.sections
    for b in store.best(cid):
        assert f"{b['speedup_eager']:.2f}×" in html
        # the band implied by the candidate's p20/p80 against the eager median
        assert f"{b['eager_ms'] / b['p80_ms']:.2f}–{b['eager_ms'] / b['p20_ms']:.2f}×" in html
        assert b["config"] == {"BLOCK": 128} and "{&quot;BLOCK&quot;: 128}" in html
    for bc in store.best(cid, objective="speedup_compile"):
        assert f"{bc['speedup_compile']:.2f}×" in html
    for pid in {c["problem_id"] for c in store.candidates(cid)}:
        name = store.get_problem(pid)["name"]
        assert parsed.nodes[name] == len(store.candidates(cid, pid))  # one node per candidate
    # the analyst's words appear in the lineage, the failures by class, the LLM cost totals
    assert "problem 1: tensor cores busy 73%" in html and "split-K" in html
    assert "unsupported op" in html and "output aliases an input" in html
    total = sum(c["cost_usd"] for c in store.llm_calls(cid))
    assert f"${total:.4f}" in html and "qwen-local" in html
    assert "relu_kernel" in html and 'style="color:' in html  # highlighted with inline styles
    assert 'id="interpreted-note"' not in html and "no speedup claimed" not in html


def test_report_needs_no_network(store: Store) -> None:
    html = render(store, build_campaign(store))
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html and "url(" not in html
    assert "<link" not in html


def test_interpreted_campaign_shows_no_speedup(store: Store) -> None:
    cid = build_campaign(store, "cpu-run", interpreted=True)
    html = render(store, cid)
    parsed = _parse(html)
    assert "Triton interpreter" in html and 'id="interpreted-note"' in html
    assert "×" not in html  # no speedup anywhere, though the rows carry speedup values
    for b in store.best(cid):
        assert b["speedup_eager"] is not None  # present in the store, hidden by the report
        assert f"{b['speedup_eager']:.2f}" not in html
        assert f"{b['median_ms']:.4g} ms" in html  # the interpreted time is shown as such
    for name in ("linear_relu", "gemm_bias_gelu"):
        assert all((name, s) in parsed.sections for s in SECTIONS)
    assert "profiling needs a GPU" in html
    assert "H200" not in html and "TFLOP/s" not in html  # no GPU's ceilings on a CPU report


@pytest.mark.parametrize("metrics, expect", [("full", "arithmetic intensity"),
                                             ("ncu", "fp32 SASS instructions"),
                                             ("bandwidth", "achieved DRAM bandwidth"),
                                             ("none", "ncu (Nsight Compute) was not found on PATH")])
def test_roofline_degrades_with_the_metrics_present(store: Store, metrics: str, expect: str) -> None:
    html = render(store, build_campaign(store, metrics=metrics))
    rooflines = re.findall(r'data-section="roofline">(.*?)</section>', html, re.S)
    assert len(rooflines) == 2 and all(expect in r for r in rooflines)
    if metrics == "full":
        # FLOPs and time summed over the two kernels: (1e10 + 1e6) FLOP / 0.502 ms = 19.9 TFLOP/s
        assert all("<td>19.9</td>" in r for r in rooflines)
    if metrics == "ncu":
        # FLOPs 2*4e9 + 2*1e6 over 0.482 ms; bytes 9e6 + 3e6 (read + write)
        assert all("arithmetic intensity" in r and "<td>16.6</td>" in r and "<td>1.2e+07</td>" in r
                   for r in rooflines), rooflines[0]


def test_empty_and_unknown_campaigns(store: Store) -> None:
    cid = store.create_campaign("empty", {}, "cpu", {})
    html = render(store, cid)
    assert "no candidates yet" in html and 'data-section="llm"' in html
    with pytest.raises(StoreError):
        render(store, "nope")


def test_cli_report_writes_the_file(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    with Store(db) as s:
        build_campaign(s, "cli-run")
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", "cli-run", "--db", str(db), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("<!doctype html>") and str(out) in res.output
    assert CliRunner().invoke(main, ["report", "nope", "--db", str(db)]).exit_code == 2
    assert CliRunner().invoke(main, ["report", "cli-run", "--db", str(tmp_path / "none.db")]).exit_code == 2


def test_text_from_agents_is_escaped(store: Store) -> None:
    """Actions, analyses and errors are written by agents (LLMs): the page shows them, never runs them."""
    cid = build_campaign(store)
    evil = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"
    pid = store.candidates(cid)[0]["problem_id"]
    root = store.candidates(cid, pid)[0]["id"]
    c = store.add_candidate(cid, pid, "# " + evil + "\nclass ModelNew: pass\n", parent_id=root, action=evil)
    store.add_evaluation(c, {"status": "crash", "error_text": evil, "error_class": evil, "device": "x"})
    store.add_event(cid, "analyze", {"candidate_id": root, "bound": evil, "evidence": evil, "next_ideas": [evil]})
    store.add_llm_call({"campaign_id": cid, "role": evil, "model": evil, "cost_usd": 0.5})
    html = render(store, cid)
    assert "<script>document" not in html and "<img src=x" not in html
    assert html.count("<script>") == 2  # the report's own two: error capture in <head>, its sink at the end


@pytest.mark.parametrize("n", [1, 2, 127])
def test_svg_tree_places_every_node(n: int) -> None:
    from kernellab import _svg

    # a chain for the first half, then a fan: deep and wide at once
    nodes = [{"id": f"c{i}", "parent": f"c{i - 1}" if 0 < i <= n // 2 else ("c0" if i else None),
              "colour": "#000", "title": f"node {i}"} for i in range(n)]
    svg = _svg.tree(nodes)
    assert svg.count('class="kl-node"') == n and svg.count("<line") == n - 1
    assert "no data" in _svg.tree([]) and "no data" in _svg.line_chart([], x_label="x", y_label="y")
    assert _svg.nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]


def _speedups_html(html: str, problem: str) -> str:
    art = html.split(f'data-problem="{problem}"', 1)[1]
    return art.split('data-section="speedups"', 1)[1].split("</section>", 1)[0]


def test_report_shows_the_reported_best_under_the_campaign_objective(store: Store) -> None:
    """One winner per problem under the campaign's --objective, and its re-timing when it has one."""
    from report_campaign import timed

    from kernellab.store import WINNER_RETIME

    cid = build_campaign(store)
    camp = store.get_campaign(cid)
    store.update_campaign(cid, config={**camp["config"], "objective": "speedup_compile"})
    pid = store.candidates(cid)[0]["problem_id"]
    name = store.get_problem(pid)["name"]
    seed = store.candidates(cid, pid)[0]["id"]
    # fastest against eager, slow against torch.compile: the winner only under speedup_eager
    odd = store.add_candidate(cid, pid, store.get_candidate(seed)["source"] + "# odd\n", parent_id=seed, action="odd")
    store.add_evaluation(odd, timed(0.2, False, eager_ms=2.0, speedup_eager=10.0, compile_ms=0.1, speedup_compile=0.5))
    sel = store.best(cid, pid, "speedup_compile")[0]
    assert sel["candidate_id"] != odd
    section = _speedups_html(render(store, cid), name)
    assert "10.00×" not in section and f"{sel['speedup_compile']:.2f}×" in section
    assert "not re-timed" in section

    # the winner re-timed in a fresh job: that number replaces the best of its evaluations
    rt = timed(1.0, False, config=sel["config"], speedup_compile=1.6, speedup_eager=2.0,
               details={WINNER_RETIME: {"selected": sel["id"], "band": {
                   "eager": {"p20_ms": 1.9, "p80_ms": 2.1}, "compile": {"p20_ms": 1.5, "p80_ms": 1.7},
                   "win_eager": True, "win_compile": False}}})
    rt["id"] = "winner-retime"
    store.add_evaluation(sel["candidate_id"], rt, kind="retime")
    section = _speedups_html(render(store, cid), name)
    assert "1.60×" in section and f"{sel['speedup_compile']:.2f}×" not in section
    assert "band overlaps the baseline" in section and "band clears the baseline" in section


def test_problem_mode_in_report_and_show(tmp_path: Path) -> None:
    """The mode (train: batch statistics, as KernelBench; eval: inference) changes what was timed:
    the report and `kernellab show` say which one a problem ran in."""
    import json

    from kernellab.problem import load_problem

    root = Path(__file__).resolve().parents[2]
    db = tmp_path / "k.db"
    with Store(db) as s:
        cid = s.create_campaign("modes", {}, "cpu", {})
        cands = {}
        for rel in ("experiments/problems/fusions/conv_bn_relu.py", "tests/sandbox/problems/bn_train.py"):
            p = load_problem(root / rel, validate_run=False)
            cands[p.mode] = s.add_candidate(cid, s.add_problem(p), f"# candidate of {p.name}\n", origin="seed")
        html = render(s, cid)
    modes = re.findall(r'data-problem="(\w+)"><h2>\w+</h2><p class="settings" data-mode="(\w+)">', html)
    assert sorted(modes) == [("bn_train", "train"), ("conv_bn_relu", "eval")]
    for mode, cand in cands.items():
        res = CliRunner().invoke(main, ["show", cand, "--db", str(db), "--no-source"])
        assert res.exit_code == 0, res.output
        assert f"(mode {mode})" in res.output
        res = CliRunner().invoke(main, ["show", cand, "--db", str(db), "--json"])
        assert json.loads(res.output)["problem"]["mode"] == mode
