"""Whole models (``kernellab.optimize``): find a model's hot subgraphs, run a campaign on each, and put the winners back.

``optimize(model, example_inputs)``
  1. *split*: the model's module tree is cut into units (:func:`split`). A module whose subtree holds at
     most ``max_heavy`` library-heavy ops (matmul/conv modules) is one unit, a fusion region the builtin
     planner fuses as a whole (a transformer block, a ResNet block, an MLP block); a bigger one is
     descended into; an ``nn.Sequential`` too big for one unit is cut into regions that each start at a
     heavy op and take the light ops after it (conv + bn + relu). Containers are descended into.
  2. *dedupe*: each unit is traced with ``torch.fx.symbolic_trace``; its structure key is the class name,
     the traced code, every submodule's type and ``extra_repr`` and every parameter's shape and dtype,
     and with the unit's input shapes that is one problem: a transformer's N equal blocks are one problem.
  3. *rank*: forward hooks time each unit on the example inputs (CUDA events on a GPU), and problems are
     ranked by their share of the model's time (Amdahl: a share ``s`` bounds the model's gain to 1/(1-s)).
  4. *campaigns*: one campaign per problem (``Problem.from_module`` of the traced unit, whose leaves are
     ``torch.nn`` modules a sandbox worker can unpickle), most promising first, within one total budget
     of candidates and wall time. Each campaign is named after its key, so a rerun into the same
     database skips finished problems and resumes an interrupted one.
  5. *patch*: :func:`patch` gives back a copy of the model whose units run their winner's ``ModelNew``
     (with that unit's own weights loaded), PyTorch elsewhere, checked end to end on fresh inputs.

Loading a winner runs candidate code in *this* process: the code the sandbox judged, but not sandboxed
here. ``patch`` (and ``optimize``, which calls it) is therefore the user's explicit choice to trust it.

The stages, one module each, in the order a run takes them: ``units`` (the Unit and OptimizeError),
``tracing``, ``splitting``, ``profiling``, ``tasks``, ``loop`` (:func:`optimize`: the budget loop),
``patched`` (the patched modules), ``verify``, ``patching`` (:func:`patch`), ``timing``, ``spec`` (the CLI's
model argument) and ``render``. This module only re-exports; ``kernellab.optimize`` is :func:`optimize`.
"""

from __future__ import annotations

from kernellab.wholemodel.loop import interpreted_size_warning, optimize
from kernellab.wholemodel.patching import MIN_PATCH_SPEEDUP, patch
from kernellab.wholemodel.profiling import profile_units
from kernellab.wholemodel.render import print_result, row_notes
from kernellab.wholemodel.spec import load_model_spec
from kernellab.wholemodel.splitting import HEAVY, heavy_count, split
from kernellab.wholemodel.tasks import PREFIX, STAND_IN_ABOVE, Task, make_tasks, start_task
from kernellab.wholemodel.timing import time_models
from kernellab.wholemodel.units import OptimizeError, Unit
from kernellab.wholemodel.verify import E2E_TOL, fresh_inputs, unit_tolerance

__all__ = ["OptimizeError", "Unit", "Task", "split", "heavy_count", "HEAVY", "profile_units", "make_tasks",
           "start_task", "optimize", "patch", "time_models", "load_model_spec", "fresh_inputs", "unit_tolerance",
           "interpreted_size_warning", "row_notes", "print_result", "E2E_TOL", "MIN_PATCH_SPEEDUP", "PREFIX",
           "STAND_IN_ABOVE"]
