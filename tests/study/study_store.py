"""A store built by hand through the real store API, with known numbers, for compare's statistics."""

from __future__ import annotations

from kernellab.problem import Problem

PROBLEMS = [Problem(name=f"p{i}", source=f"# hand-built problem {i}\n", path=f"p{i}.py") for i in range(4)]
SEEDS = (0, 1)


def add_run(store, name: str, problem: Problem, *, policy: str, seed: int, values: list[dict],
            llm: str = "builtin", calls: list[dict] = (), status: str = "done", objective: str = "speedup_eager") -> str:
    """One finished campaign of one problem whose ``full`` evaluations are ``values`` in order; each a
    dict of overrides on a correct, GPU-timed evaluation (``speedup`` sets speedup_eager)."""
    pid = store.add_problem(problem)
    cid = store.create_campaign(name, {"problem_ids": [pid], "policy": policy, "seed": seed, "llm": llm,
                                       "objective": objective}, "NVIDIA H200", {})
    for k, v in enumerate(values):
        v = dict(v)
        speedup = v.pop("speedup", None)
        cand = store.add_candidate(cid, pid, f"class ModelNew:  # {name} {k}\n    pass\n", origin="builtin",
                                   action=f"step {k}")
        interpreted = v.get("interpreted", False)
        row = {"status": "correct", "median_ms": 1.0 / (speedup or 1.0), "p20_ms": 0.9 / (speedup or 1.0),
               "p80_ms": 1.1 / (speedup or 1.0), "eager_ms": 1.0, "compile_ms": 1.2,
               "speedup_eager": None if interpreted else speedup,
               "speedup_compile": None if interpreted or speedup is None else 1.2 * speedup,
               "own_kernel_share": 0.9, "library_only": False, "interpreted": interpreted,
               "details": {"gpu_s": 0.5}}
        row.update(v)
        store.add_evaluation(cand, row)
    for c in calls:
        store.add_llm_call({"campaign_id": cid, "role": "coder", "model": llm, **c})
    store.update_campaign(cid, status=status)
    return cid
