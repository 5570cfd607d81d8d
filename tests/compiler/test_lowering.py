"""The lowering registry (``kernellab/compiler/lowering.py``): one function per ATen op, filled by ``@lowering``;
what each lowering emits is pinned by ``test_sources_unchanged.py`` (every KernelBench level1/level2 source)."""

from __future__ import annotations

import pytest

from kernellab.compiler import lowering as L


def test_every_family_is_registered():
    for op in ("relu.default", "relu6.default", "mul.Tensor", "add.Tensor", "rsub.Scalar", "softmax.int",
               "layer_norm.default", "_native_batch_norm_legit_functional.default", "linear.default",
               "matmul.default", "conv2d.default", "cumsum.default", "max_pool2d.default", "var.correction"):
        assert op in L.LOWERINGS, op
    assert L.LOWERINGS["relu6.default"] is not L.LOWERINGS["relu.default"]
    assert not set(L.LOWERINGS) & L.VIEW_OPS  # views stay views


def test_an_op_is_lowered_once():
    with pytest.raises(ValueError, match="relu.default already lowered"):
        L.lowering("relu.default")(lambda c, b: True)
    assert L.LOWERINGS["relu.default"].__name__ == "_unary"


def test_an_op_without_a_lowering_stays_aten():
    from kernellab.compiler.ir import Graph, Node

    node = Node("y", "aten", "argmax.default", (), {"bound": {}, "args": (), "kwargs": {}}, (4,), "int64")
    assert [n.kind for n in L.lower_node(node, Graph([node], [], []))] == ["opaque"]
