"""Issue 34, item 3: off a terminal (a pipe, a file) the CLI's output keeps whole words and whole lines."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from kernellab.cli import main
from kernellab.problem import load_problem
from kernellab.store import Store

PROBLEM = Path(__file__).resolve().parents[1] / "problems" / "kb_gemm_add_relu.py"
LONG = "x = torch.nn.functional.relu(torch.nn.functional.linear(x, self.weight, self.bias)) * 2.0 + 1.0  # " + "w" * 60
ACTION = "fuse the bias add and the ReLU into the GEMM epilogue, then retile to BLOCK_M=128"


def test_show_and_lineage_keep_whole_lines_off_a_terminal(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    with Store(db) as store:
        cid = store.create_campaign("c", {"budget": 2}, "cpu", {})
        pid = store.add_problem(load_problem(PROBLEM))
        root = store.add_candidate(cid, pid, "import torch\n", origin="seed", action="seed")
        cand = store.add_candidate(cid, pid, f"import torch\n{LONG}\n", parent_id=root, origin="builtin", action=ACTION)
    show = CliRunner().invoke(main, ["show", cand, "--db", str(db)])  # CliRunner's stdout is no terminal
    assert show.exit_code == 0, show.output
    assert LONG in show.stdout.splitlines()  # the source line whole, as in the file, no padding
    lineage = CliRunner().invoke(main, ["lineage", cand, "--db", str(db)])
    assert lineage.exit_code == 0, lineage.output
    assert ACTION in lineage.stdout  # on one line, not folded into a 9-character column
