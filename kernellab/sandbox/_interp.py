"""A compatibility fix for the Triton interpreter in CPU workers.

Triton 3.6's interpreter turns a runtime scalar into a Python int with ``int(array_of_shape_1)``,
which NumPy >= 2.4 refuses ("only 0-dimensional arrays can be converted"), so every kernel whose
``range`` has a runtime bound fails in the interpreter although it is correct on the GPU. Until the
environment pins numpy < 2.4, workers patch that one method (the same shim as tests/builtin).
"""

from __future__ import annotations


def apply_numpy_shim() -> bool:
    import numpy as np

    if tuple(int(x) for x in np.__version__.split(".")[:2]) < (2, 4):
        return False
    try:
        import triton.runtime.interpreter as interp
    except Exception:  # pragma: no cover
        return False
    if getattr(interp._patch_lang_tensor, "_kl_shim", False):
        return True
    orig = interp._patch_lang_tensor

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._kl_shim = True
    interp._patch_lang_tensor = patched
    return True
