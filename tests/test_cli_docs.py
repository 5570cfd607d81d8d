"""Every CLI command has help text and is documented in README.md (the sqlite-utils habit)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernellab.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
COMMANDS = sorted(main.commands)


def test_the_cli_has_commands() -> None:
    assert {"run", "resume", "status", "show", "lineage", "eval", "report", "export", "bench"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_command_has_help(name: str) -> None:
    cmd = main.commands[name]
    assert (cmd.help or "").strip(), f"`kernellab {name}` has no help text"
    assert "not in this build yet" not in cmd.help, f"`kernellab {name}` is still a stub"
    res = CliRunner().invoke(main, [name, "--help"])
    assert res.exit_code == 0, res.output
    assert cmd.help.strip().split("\n")[0][:30] in " ".join(res.output.split())


@pytest.mark.parametrize("name", COMMANDS)
def test_command_is_in_readme(name: str) -> None:
    text = README.read_text(encoding="utf-8")
    assert re.search(rf"kernellab {re.escape(name)}\b", text), f"README.md does not mention `kernellab {name}`"


def test_code_refers_to_no_file_outside_the_repository() -> None:
    # DESIGN.md lives outside the repository: a newcomer's clone has no such file to read
    root = README.parent
    offenders = [str(p.relative_to(root)) for folder in ("kernellab", "agents", "search", "sandbox", "store")
                 for p in (root / folder).rglob("*.py") if "DESIGN.md" in p.read_text(encoding="utf-8")]
    assert not offenders, offenders
    assert "DESIGN.md" not in README.read_text(encoding="utf-8")
