"""Triton kernel templates with named holes, and the small renderer that fills them (standard library only: the
kernel families load on a GPU host without the rest of kernellab).

A template is Triton source text. A line that holds only ``{{NAME}}`` (after its indentation) is a *block hole*:
it is replaced by the hole's lines, each indented as the placeholder is (no lines: the line goes). ``{{NAME}}``
inside a line is an *inline hole*, replaced by its text. Every hole must be given, and every hole given used.
"""

from __future__ import annotations

import re
import textwrap

__all__ = ["render", "indent", "stmts"]

_HOLE = re.compile(r"\{\{([A-Z0-9_]+)\}\}")
_BLOCK = re.compile(r"^( *)\{\{([A-Z0-9_]+)\}\}$")


def indent(lines: list[str], n: int) -> list[str]:
    """``lines`` indented by ``n`` levels of four spaces (empty lines stay empty)."""
    pad = " " * (4 * n)
    return [pad + ln if ln else ln for ln in lines]


def stmts(text: str) -> list[str]:
    """The non-blank lines of a statement block, dedented."""
    return [ln.rstrip() for ln in textwrap.dedent(text).strip("\n").splitlines() if ln.strip()]


def _lines(value: str | list[str]) -> list[str]:
    if isinstance(value, str):  # a text ends its last line with its last newline, as a template does
        return value.removesuffix("\n").split("\n") if value else []
    return list(value)


def render(template: str, **holes: str | list[str]) -> list[str]:
    """The template's lines with every hole filled (see the module docstring). A block hole takes a list of
    lines or a text (split at newlines, its last newline ending its last line); an inline hole a text. The template's last newline ends its last line."""
    used: set[str] = set()
    out: list[str] = []
    for line in template.removesuffix("\n").split("\n"):
        block = _BLOCK.match(line)
        if block:
            pad, name = block.groups()
            if name not in holes:
                raise KeyError(f"template hole {{{{{name}}}}} not filled")
            used.add(name)
            out += [pad + ln if ln else ln for ln in _lines(holes[name])]
            continue

        def inline(m: re.Match) -> str:
            if m.group(1) not in holes:
                raise KeyError(f"template hole {{{{{m.group(1)}}}}} not filled")
            used.add(m.group(1))
            value = holes[m.group(1)]
            if not isinstance(value, str) or "\n" in value:
                raise TypeError(f"inline hole {{{{{m.group(1)}}}}} takes one line of text")
            return value

        out.append(_HOLE.sub(inline, line))
    unused = set(holes) - used
    if unused:
        raise KeyError(f"holes given but not in the template: {sorted(unused)}")
    return out
