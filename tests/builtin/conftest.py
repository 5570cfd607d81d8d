from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest
import torch

from kernellab.sandbox._interp import apply_numpy_shim

# Triton 3.6's interpreter cannot turn runtime loop bounds into ints under NumPy >= 2.4; the sandbox
# workers patch it the same way.
apply_numpy_shim()

TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}
_ids = itertools.count()


def load_source(source: str, tmp: Path) -> object:
    """Import a candidate file (Triton reads kernel source from the file, so it must be one)."""
    name = f"kl_builtin_cand_{next(_ids)}"
    f = tmp / f"{name}.py"
    f.write_text(source)
    spec = importlib.util.spec_from_file_location(name, f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def assert_close(out, ref, dtype: torch.dtype, atol: float | None = None, rtol: float | None = None) -> None:
    a, r = TOL[dtype]
    atol, rtol = atol or a, rtol or r
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(outs) == len(refs)
    for o, e in zip(outs, refs, strict=True):
        assert o.shape == e.shape, f"shape {tuple(o.shape)} != reference {tuple(e.shape)}"
        assert o.dtype == e.dtype, f"dtype {o.dtype} != reference {e.dtype}"
        of, ef = o.float(), e.float()
        bad = ~torch.isclose(of, ef, atol=atol, rtol=rtol, equal_nan=True)
        if bad.any():
            idx = bad.nonzero()[:5].tolist()
            pytest.fail(f"{int(bad.sum())}/{bad.numel()} mismatches, first at {idx}: "
                        f"got {[of[tuple(i)].item() for i in idx]}, want {[ef[tuple(i)].item() for i in idx]}; "
                        f"NaN got/want {int(of.isnan().sum())}/{int(ef.isnan().sum())}")


@pytest.fixture
def load(tmp_path):
    return lambda source: load_source(source, tmp_path)


@pytest.fixture
def close():
    return assert_close
