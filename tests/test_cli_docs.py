"""Every CLI command has help text and is documented in README.md (the sqlite-utils habit)."""

from __future__ import annotations

import re
from pathlib import Path

import click
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


# -- the command table: generated from the CLI, never written by hand --------------------------------------------

def test_readme_command_table_is_the_generated_one() -> None:
    import difflib

    from kernellab.cli import _doc

    have, want = _doc.between_markers(README.read_text(encoding="utf-8")), _doc.command_table()
    diff = "\n".join(difflib.unified_diff(have.splitlines(), want.splitlines(), "README.md", "the CLI", lineterm=""))
    assert have == want, f"README.md's command table is stale: regenerate it with `make readme` " \
                         f"(python -m kernellab.cli._doc)\n{diff}"


@pytest.mark.parametrize("name", COMMANDS)
def test_the_table_row_holds_the_summary_and_every_option(name: str) -> None:
    from kernellab.cli import _doc

    cmd = main.commands[name]
    rows = [r for r in _doc.command_table().splitlines() if r.startswith(f"| `kernellab {name}")]
    assert len(rows) == 1, rows
    row = rows[0]
    assert _doc.summary(cmd) and _doc._cell(_doc.summary(cmd)) in row
    shared = _doc.campaign_options()
    for param in cmd.params:
        if isinstance(param, click.Option):
            option = _doc._option_name(param)
            assert f"`{option}`" in row or (option in shared and "the campaign options" in row), (name, option)


@pytest.mark.parametrize("name", COMMANDS)
def test_the_summary_is_one_short_sentence(name: str) -> None:
    # the table shows the first paragraph of the help: a longer one belongs after a blank line in the docstring
    from kernellab.cli import _doc

    text = _doc.summary(main.commands[name])
    assert text.endswith(".") and ". " not in text and len(text) <= 200, \
        f"`kernellab {name}`: the first paragraph of its help is not a one-sentence summary: {text!r}"


def test_the_campaign_options_are_the_shared_ones() -> None:
    from kernellab.cli import _doc

    shared = _doc.campaign_options()
    assert {"--llm", "--budget", "--policy", "--device"} <= set(shared)
    table = _doc.command_table()
    assert table.splitlines()[-1] == "The campaign options: " + " ".join(f"`{o}`" for o in shared) + "."


def test_the_table_escapes_what_would_break_a_cell() -> None:
    from kernellab.cli import _doc

    assert _doc._cell("a|b <date>") == "a\\|b &lt;date&gt;"
    # a choice list or a pipe in a summary must not add a column to its row
    for row in _doc.command_table().splitlines()[2:]:
        if row.startswith("|"):
            assert len(re.findall(r"(?<!\\)\|", row)) == 4, row


def test_the_table_is_replaced_between_the_markers_only(tmp_path: Path) -> None:
    from kernellab.cli import _doc

    text = f"before\n{_doc.START}\n| old |\n{_doc.END}\nafter\n"
    assert _doc.with_table(text, "| new |") == f"before\n{_doc.START}\n| new |\n{_doc.END}\nafter\n"
    with pytest.raises(ValueError):
        _doc.with_table("no markers here", "| new |")

    readme = tmp_path / "README.md"
    readme.write_text(text, encoding="utf-8")
    assert _doc.main([str(readme), "--check"]) == 1
    assert readme.read_text(encoding="utf-8") == text  # --check writes nothing
    assert _doc.main([str(readme)]) == 0
    assert _doc.between_markers(readme.read_text(encoding="utf-8")) == _doc.command_table()
    assert _doc.main([str(readme), "--check"]) == 0


# -- links: every relative link in README.md and docs/ leads somewhere in the repository -------------------------

ROOT = README.parent
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)


def relative_links(text: str) -> list[str]:
    """The targets of the markdown links (inline and reference-style) outside code blocks, URLs left out."""
    text = _FENCE.sub("", text)
    targets = [m.group(1) for m in _LINK.finditer(text)] + [m.group(1) for m in _REF.finditer(text)]
    return [t for t in targets if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", t)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", _FENCE.sub("", text), re.M):
        s = slug(m.group(1))
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def test_the_link_finder() -> None:
    text = ("see [the guide](docs/guide.md#a-walkthrough), ![a plot](img/p.svg) and [`a path`](experiments/)\n"
            "[a site](https://example.com) [mail](mailto:a@b.c) [here](#top)\n"
            "```bash\n[not a link](nowhere.md)\n# not a heading\n```\n[ref]: docs/gpu.md\n")
    assert relative_links(text) == ["docs/guide.md#a-walkthrough", "img/p.svg", "experiments/", "#top", "docs/gpu.md"]
    assert slug("Whole models: `kernellab optimize`") == "whole-models-kernellab-optimize"
    assert slug("Route 1: one evaluation through the sandbox") == "route-1-one-evaluation-through-the-sandbox"
    assert anchors("# A\n## B c\n## B c\n```\n# D\n```\n") == {"a", "b-c", "b-c-1"}


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in relative_links(doc.read_text(encoding="utf-8")):
        path, _, fragment = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif not dest.is_relative_to(ROOT):
            # a clone of the repository has nothing outside it
            broken.append(f"{target}: outside the repository")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


def test_the_readme_links_the_docs() -> None:
    links = {t.partition("#")[0] for t in relative_links(README.read_text(encoding="utf-8"))}
    assert {"docs/ARCHITECTURE.md", "docs/guide.md"} <= links
    assert {f"docs/{p.name}" for p in DOCS[1:]} <= links, "a page under docs/ that the README does not link"


# -- the layer table of docs/ARCHITECTURE.md is the import graph's order ----------------------------------------

ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def layer_rows(text: str) -> dict[str, int]:
    """Top-level module of kernellab -> the row of ARCHITECTURE.md's layer table naming it (0 = the bottom)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| layer | modules |"))
    rows: dict[str, int] = {}
    for n, line in enumerate(lines[start + 2:]):
        if not line.startswith("|"):
            break
        for name in re.findall(r"`([\w./]+)`", line.split("|")[2]):
            rows.setdefault(name.removesuffix(".py").strip("/").split("/")[0], n)
    return rows


def test_the_layer_table_names_every_part_of_the_tree() -> None:
    rows = layer_rows(ARCHITECTURE.read_text(encoding="utf-8"))
    tree = {p.stem for p in (ROOT / "kernellab").glob("*.py") if p.stem != "__init__"} | \
           {p.parent.name for p in (ROOT / "kernellab").glob("*/__init__.py")}
    assert tree - set(rows) == set(), "docs/ARCHITECTURE.md's layer table leaves out these parts of kernellab/"
    assert set(rows) - tree == set(), "docs/ARCHITECTURE.md's layer table names parts kernellab/ does not have"


def test_the_layer_table_is_the_import_order() -> None:
    # a module-level import reaches only its own row or one below it: the table says what the tree does
    from test_layers import import_graph

    rows = layer_rows(ARCHITECTURE.read_text(encoding="utf-8"))

    def top(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else None

    upward = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets
                    if top(a) and top(b) and rows[top(b)] > rows[top(a)])
    assert rows["vocab"] < rows["store"] < rows["agents"] < rows["campaign"] < rows["cli"]
    assert not upward, "module-level imports that run upward through docs/ARCHITECTURE.md's layer table:\n" + \
        "\n".join(upward)
