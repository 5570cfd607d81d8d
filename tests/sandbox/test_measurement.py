"""What the sandbox measures, in pieces: fresh timing inputs, own kernels by exact launched name,
CuPy launch recording, and the reference-forward watch against aliases (the end-to-end cases are
candidates in ``adversarial/``)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from kernellab.sandbox import EvalJob
from kernellab.sandbox._guard import ForwardWatch, LaunchCounter, record_cupy
from kernellab.sandbox._measure import _is_own, _kernel_key, _new_addresses
from kernellab.sandbox._reference import FINAL_MIX, FRESH_EVERY, _Fresh
from kernellab.sandbox._timing import time_cpu

TORCH_ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
             "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
SOFTMAX = ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, false, false>"
           "(float*, float const*, int, int, int, bool const*, int, bool)")
CUBLAS = "cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4"


# -- own kernels: exact names ------------------------------------------------------------------

def test_kernel_key_drops_return_type_and_arguments_only():
    assert _kernel_key("relu_kernel") == "relu_kernel"
    assert _kernel_key("void relu2<float>(float const*, float*, int)") == "relu2<float>"
    assert _kernel_key(TORCH_ADD).startswith("at::native::vectorized_elementwise_kernel<4,")
    assert _kernel_key(SOFTMAX).startswith("(anonymousnamespace)::softmax_warp_forward<float,")


@pytest.mark.parametrize("kernel, own, expected", [
    ("relu_kernel", {"relu_kernel"}, True),  # Triton: the profiler shows the jit function's name
    ("relu_kernel_2", {"relu_kernel"}, False),
    ("fused_relu_kernel", {"relu_kernel"}, False),
    ("relu2_cupy", {"relu2_cupy"}, True),  # CuPy extern "C"
    ("void relu2<float>(float const*, float*, int)", {"relu2<float>"}, True),  # CuPy name expression
    ("void relu2<float>(float const*, float*, int)", {"relu2<double>"}, False),
    ("void relu2<float>(float const*, float*, int)", {"relu2"}, False),
    # names a comment could declare: none is the name of the library kernel they imitate
    (TORCH_ADD, {"vectorized_elementwise_kernel"}, False),
    (TORCH_ADD, {"elementwise_kernel", "at::native"}, False),
    (SOFTMAX, {"softmax_warp_forward"}, False),
    (CUBLAS, {"cutlass_80_tensorop", "tensorop_s1688gemm", "cutlass"}, False),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", {"xmma_gemm"}, False),
    ("anything", set(), False),
    ("", {""}, False),
])
def test_is_own_matches_exact_names_only(kernel, own, expected):
    assert _is_own(kernel, own) is expected


# -- CuPy launches are recorded (a stand-in for CuPy's classes: CuPy needs a GPU) --------------

class _FakeRawKernel:
    def __init__(self, code: str, name: str, **kw) -> None:
        self.code, self.name = code, name

    def __call__(self, grid, block, args, **kw):
        return ("launched", self.name, grid, block)


class _FakeRawModule:
    def __init__(self, code: str = "", **kw) -> None:
        self.code = code

    def get_function(self, name: str):
        return _FakeRawKernel(self.code, name)


def test_cupy_launches_record_the_launched_names_while_armed():
    cupy = types.SimpleNamespace(RawKernel=_FakeRawKernel, RawModule=_FakeRawModule)
    counter = LaunchCounter(hooks=False)
    record_cupy(counter, cupy)
    # what the candidate's `import cupy` then sees: subclasses, same names, same behaviour
    k = cupy.RawKernel("src", "relu2_cupy")
    assert isinstance(k, _FakeRawKernel) and cupy.RawKernel is not _FakeRawKernel
    assert cupy.RawKernel.__name__ == "_FakeRawKernel"
    f = cupy.RawModule(code="src").get_function("relu2<float>")
    assert f.code == "src"  # other attributes reach the kernel
    assert k((1,), (32,), ()) == ("launched", "relu2_cupy", (1,), (32,))
    assert counter.names == set()  # not armed: nothing is the candidate's
    counter.armed = True
    cupy.RawModule(code="src").get_function("never_launched")
    k((1,), (32,), ())
    assert f((2,), (64,), ()) == ("launched", "relu2<float>", (2,), (64,))
    assert counter.names == {"relu2_cupy", "relu2<float>"}  # launched ones only
    counter.reset()
    assert counter.names == set()


# -- the reference forward watch sees aliases taken before it was installed ------------------

def _classes():
    class Model(torch.nn.Module):
        def forward(self, x, *, scale=2.0):
            return torch.relu(x * scale) + 1.0

    class Child(Model):  # forward closes over __class__ (super())
        def forward(self, x):
            return super().forward(x) - 1.0

    return Model, Child


def test_forward_watch_counts_calls_through_aliases_taken_before_it():
    Model, Child = _classes()
    alias, child_alias = Model.forward, Child.__dict__["forward"]  # as a candidate module would keep them
    code = Model.forward.__code__
    x = torch.tensor([-1.0, 2.0])
    watch = ForwardWatch([Model, Child])
    try:
        assert torch.equal(alias(Model(), x), torch.tensor([1.0, 5.0]))
        assert watch.calls == 0  # not armed
        watch.armed = True
        assert torch.equal(alias(Model(), x, scale=1.0), torch.tensor([1.0, 3.0]))  # keyword-only default kept
        assert watch.calls == 1
        assert torch.equal(child_alias(Child(), x), torch.tensor([0.0, 4.0]))  # Child's and Model's forward
        assert watch.calls == 3
        Model()(x)
        assert watch.calls == 4
    finally:
        watch.close()
    assert Model.forward.__code__ is code and alias is Model.forward
    watch.calls = 0
    assert torch.equal(alias(Model(), x), torch.tensor([1.0, 5.0])) and torch.equal(Child()(x), torch.tensor([0.0, 4.0]))


# -- fresh timing inputs ------------------------------------------------------------------------

def test_the_last_repetition_gets_the_final_mix_its_reference_was_computed_for():
    a, b = [torch.zeros(3), torch.arange(3)], [torch.ones(3), torch.arange(3) + 5]
    fresh = _Fresh(a, b, seed=2)
    for _ in range(5):
        fresh()
        assert not torch.allclose(fresh.current[0], torch.full((3,), FINAL_MIX), atol=0.1)
    fresh(last=True)
    assert torch.equal(fresh.current[0], torch.full((3,), FINAL_MIX)) and torch.equal(fresh.current[1], a[1])
    assert all(torch.equal(x, y) for x, y in zip(fresh.current, _Fresh.mix(a, b, FINAL_MIX), strict=True))


def test_fresh_inputs_differ_every_repetition_and_move_to_new_tensors():
    g = torch.Generator().manual_seed(0)
    a = [torch.rand(6, 5, generator=g), torch.arange(4), 3]
    b = [torch.rand(6, 5, generator=g) + 1.0, torch.arange(4) + 10, 3]
    fresh = _Fresh(a, b, seed=1)
    seen, ptrs, versions = [], [], []
    for _ in range(4 * FRESH_EVERY):
        fresh()
        x, idx, n = fresh.current
        assert n == 3 and not any(torch.equal(x, s) for s in seen)  # values never repeat...
        assert bool(((x > a[0]) & (x < b[0])).all())  # ...and stay between the two samples
        assert torch.equal(idx, a[1]) or torch.equal(idx, b[1])  # integer inputs: one sample or the other
        seen.append(x.clone())
        ptrs.append(x.data_ptr())
        versions.append(x._version)
    assert not torch.equal(a[0], seen[0])  # trial 0's own values are never the timed ones
    blocks = [set(ptrs[i:i + FRESH_EVERY]) for i in range(0, len(ptrs), FRESH_EVERY)]
    assert all(len(s) == 1 for s in blocks) and blocks[0] != blocks[1] and blocks[0] == blocks[2]
    assert all(v > 0 for v in versions)  # written in place: the version counter moves as well


def test_time_cpu_prepares_before_every_call_of_its_callable():
    log: list[str] = []
    fns = {"a": lambda: log.append("a"), "b": lambda: log.append("b")}
    out = time_cpu(fns, prepare={"a": lambda last=False: log.append("last-a" if last else "prep-a")})
    calls_a = [i for i, e in enumerate(log) if e == "a"]
    assert len(calls_a) == out["a"]["reps"] + 1  # the estimate's call and the timed ones
    assert [log[i - 1] for i in calls_a] == ["prep-a"] * (len(calls_a) - 1) + ["last-a"]
    assert not any(e.endswith("-b") for e in log)


def test_new_addresses_are_copies_no_allocation_starts_at():
    xs = [torch.randn(5, 7), torch.randn(7, 5).t(), torch.randn(3).half(), torch.arange(4), 3]
    for _ in range(20):
        ys = _new_addresses(xs)
        assert ys[-1] == 3
        for x, y in zip(xs[:-1], ys[:-1], strict=True):
            assert torch.equal(x, y) and y.stride() == x.stride() and y.data_ptr() % 64 == 16


def test_an_early_stopped_timing_still_checks_its_last_output(sandbox_executor, problem):
    src = (Path(__file__).parent / "adversarial" / "caches_trusting_repeats.py").read_text()
    r = sandbox_executor.submit(EvalJob(problem("tiny_relu"), src, trials=3, stop_above_ms=1e-6)).result(timeout=600)
    assert (r["status"], r["error_class"]) == ("rejected", "integrity:cached_result"), r["error_text"]
