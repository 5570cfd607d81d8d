# The README's two commands: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch 2.13 lies on this kind of machine's local disk; installing it first keeps
# pip from resolving the unpinned range in pyproject.toml to a multi-GB CUDA build. Override on a
# GPU machine, e.g. `make demo TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
# The Triton interpreter runs kernels on the CPU; same release as the GPU host (3.6).
TRITON_SPEC ?= triton==3.6.0
# numpy 2.3+ breaks the Triton 3.6 interpreter on `range()` over a runtime scalar ("only 0-dimensional
# arrays can be converted to Python scalars"); the GPU path does not use numpy there.
NUMPY_SPEC ?= numpy>=1.26,<2.3

export PYTHONUNBUFFERED := 1

.PHONY: demo test lint readme gpu-test venv clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# pip -q says nothing for minutes: one line per step says what is under way and for how long
	@echo "kernellab: building $(VENV) (a few minutes, once)"
	$(PY) -m pip install -q --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || echo "kernellab: installing $(TORCH_SPEC) (about 2 minutes)"
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	@echo "kernellab: installing triton, numpy and kernellab with its dev extras"
	$(PY) -m pip install -q "$(TRITON_SPEC)" "$(NUMPY_SPEC)" -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

# the README's `kernellab ...` commands need the venv's bin/ on PATH: say how, after the demo
demo: $(VENV)/.installed
	$(PY) -m kernellab.demo
	@echo "the kernellab command is $(VENV)/bin/kernellab: run \`source $(VENV)/bin/activate\` to use \`kernellab ...\` as in README.md"

test: $(VENV)/.installed
	TRITON_INTERPRET=1 $(PY) -m pytest -m "not gpu" -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check kernellab tests

# README.md's command table is rendered from the CLI; tests/test_cli_docs.py fails when it is stale
readme: $(VENV)/.installed
	$(PY) -m kernellab.cli._doc README.md

# On the GPU host: GPU tests and the GPU benchmarks in one call (see scripts/gpu_check.sh).
gpu-test:
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) build *.egg-info kernellab.db kernellab-report.html
