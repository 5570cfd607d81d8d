"""The template renderer (``kernellab/compiler/kernels/template.py``): block holes take the placeholder's
indentation, an empty block removes its line, inline holes take one line, and a hole missing or left over is an
error (a typo in a template must not generate a kernel silently missing a statement)."""

from __future__ import annotations

import pytest

from kernellab.compiler.kernels.template import render

T = """\
def {{NAME}}(x):
    {{BODY}}
    return x
"""


def test_block_and_inline_holes():
    assert render(T, NAME="f", BODY=["if x:", "    x = 1", "", "y = 2"]) == [
        "def f(x):", "    if x:", "        x = 1", "", "    y = 2", "    return x"]
    assert render(T, NAME="f", BODY=[]) == ["def f(x):", "    return x"]
    assert render(T, NAME="f", BODY="a = 1\nb = 2") == ["def f(x):", "    a = 1", "    b = 2", "    return x"]


def test_holes_must_match():
    with pytest.raises(KeyError, match="BODY"):
        render(T, NAME="f")
    with pytest.raises(KeyError, match="EXTRA"):
        render(T, NAME="f", BODY=[], EXTRA="x")
    with pytest.raises(TypeError, match="NAME"):
        render(T, NAME="f\ng", BODY=[])
