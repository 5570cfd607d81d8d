"""The kernel families the code generator emits, each a generator of Triton source text: ``gemm.py`` (mm / bmm /
linear with a fused epilogue or row reduction) and ``conv.py`` (implicit-GEMM convolutions) are templates with named
holes (their Triton text in ``gemm_template.py`` / ``conv_template.py``, filled by ``template.render``; the GEMM
launcher in ``gemm_launcher.py``); ``loopgen.py`` writes pointwise and row-reduction loops over a fusion group
(their launcher in ``loop_launcher.py``); ``special.py`` cumsum, embedding and max-pool; ``pointwise.py`` the
Triton expression of each pointwise op. Standard library only, except ``loopgen``/``special`` (the graph IR)."""

from __future__ import annotations

from .conv import ConvOperand, ConvSpec, conv_kernel
from .gemm import GemmSpec, KernelSource, Operand, gemm_kernel, load_kernel
from .loopgen import LoopSource, loop_kernel
from .special import SpecialSource, special_kernel

__all__ = ["GemmSpec", "Operand", "KernelSource", "gemm_kernel", "load_kernel", "ConvSpec", "ConvOperand",
           "conv_kernel", "LoopSource", "loop_kernel", "SpecialSource", "special_kernel"]
