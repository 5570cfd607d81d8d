"""The user surface speaks the one vocabulary: CLI defaults are CampaignConfig's, `report` chooses the
best under the objective, and `export` applies a tuned config as the sandbox does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernellab import Problem, report
from kernellab.campaign import CampaignConfig
from kernellab.cli import main
from kernellab.export import _bake
from kernellab.store import Store

SRC = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n" \
      "def get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return []\n"


@pytest.mark.parametrize("command", ["run", "bench"])
def test_campaign_option_defaults_are_campaign_config_defaults(command: str) -> None:
    # three defaults for --budget (CLI, bench, kernellab.run) could disagree; now there is one
    defaults = {f.name: f.default for f in dataclasses.fields(CampaignConfig) if f.name != "problems"}
    params = {p.name: p.default for p in main.commands[command].params}
    shared = set(defaults) & set(params) - {"device"}  # the CLI spells CampaignConfig's None "auto"
    assert {"budget", "tune_trials", "trials", "width", "policy", "objective", "seed"} <= shared
    assert {k: params[k] for k in shared} == {k: defaults[k] for k in shared}


def _two_winners(store: Store) -> tuple[str, str, str]:
    """A campaign (objective speedup_eager) where the best vs eager and the best vs compile differ."""
    cid = store.create_campaign("c", {"objective": "speedup_eager"}, "H200", {})
    pid = store.add_problem(Problem(name="p", source=SRC, path="p.py"))
    eager_best = store.add_candidate(cid, pid, "# eager winner", action="eager winner")
    compile_best = store.add_candidate(cid, pid, "# compile winner", parent_id=eager_best, action="compile winner")
    for cand, se, sc in ((eager_best, 3.0, 0.5), (compile_best, 2.0, 1.5)):
        store.add_evaluation(cand, {"status": "correct", "median_ms": 1.0, "p20_ms": 0.9, "p80_ms": 1.1,
                                    "eager_ms": se, "compile_ms": sc, "speedup_eager": se, "speedup_compile": sc,
                                    "device": "H200", "own_kernel_share": 1.0})
    return cid, eager_best, compile_best


def _best_section(html: str) -> str:
    start = html.index('data-section="speedups"')
    return html[start:html.index("</section>", start)]


def test_report_honours_the_objective(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    store = Store(db)
    cid, eager_best, compile_best = _two_winners(store)
    by_campaign = report.render(store, cid)
    assert eager_best[:12] in _best_section(by_campaign) and compile_best[:12] not in _best_section(by_campaign)
    by_compile = report.render(store, cid, objective="speedup_compile")
    assert compile_best[:12] in _best_section(by_compile) and eager_best[:12] not in _best_section(by_compile)
    # the tree's per-candidate results are under that objective too (they were always vs eager)
    assert "1.50× vs torch.compile" in by_compile and "3.00× vs eager" in by_campaign
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["report", "c", "--db", str(db), "-o", str(out), "--objective", "speedup_compile"])
    assert r.exit_code == 0, r.output
    assert compile_best[:12] in _best_section(out.read_text())
    r = CliRunner().invoke(main, ["report", "c", "--db", str(db), "--objective", "speedup"])
    assert r.exit_code == 2 and "speedup" in r.output


def test_export_bakes_the_sandboxs_nested_merge() -> None:
    src = "CONFIG = {'g': {'BLOCK': 64, 'num_warps': 4}, 'h': {'BLOCK': 32}}\nSPACE = {'g': {'BLOCK': [64, 128]}}\n"
    ns: dict = {}
    exec(_bake(src, {"g": {"BLOCK": 128}}), ns)
    # CONFIG.update({"g": {"BLOCK": 128}}) dropped num_warps, so the exported kernel ran another config
    assert ns["CONFIG"] == {"g": {"BLOCK": 128, "num_warps": 4}, "h": {"BLOCK": 32}}
    ns = {}
    exec(_bake("CONFIG = {'A': 1}\n", {"A": 2}), ns)
    assert ns["CONFIG"] == {"A": 2}


def test_every_status_has_a_colour_in_the_report() -> None:
    from kernellab._svg import STATUS_COLOURS
    from kernellab.vocab import STATUSES

    assert set(STATUSES) <= set(STATUS_COLOURS)
