"""Synthetic trees in a real in-memory store: candidates with evaluations written as the sandbox would."""

from __future__ import annotations

from kernellab import Problem
from kernellab.store import Store

SRC = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
       "def get_inputs():\n    return [torch.randn(4)]\ndef get_init_inputs():\n    return []\n")
GPU = "NVIDIA H200"


def result(speedup: float | None = None, status: str = "correct", *, interpreted: bool = False,
           eager_ms: float = 2.0, error_class: str | None = None, device: str = GPU, **kw) -> dict:
    ms = eager_ms / speedup if speedup else None
    return {"status": status, "median_ms": ms, "p20_ms": ms, "p80_ms": ms, "eager_ms": eager_ms,
            "speedup_eager": None if interpreted or status != "correct" else speedup,
            "interpreted": interpreted, "error_class": error_class, "device": device, **kw}


class Synth:
    """Build a tree by name: ``add("a1", parent="a", speedup=2.0)``; ids by name in ``self.ids``."""

    def __init__(self, store: Store, name: str = "c1"):
        self.store = store
        self.cid = store.create_campaign(name, {}, GPU, {})
        self.pid = store.add_problem(Problem(name="p", source=SRC, path="p.py"))
        self.ids: dict[str, str] = {}

    def add(self, name: str, parent: str | None = None, speedup: float | None = None, status: str = "correct",
            kind: str = "full", **kw) -> str:
        cid = self.store.add_candidate(self.cid, self.pid, f"# {name}\n", action=f"make {name}",
                                       parent_id=self.ids.get(parent), origin="seed" if parent is None else "builtin")
        self.ids[name] = cid
        if status is not None:
            self.store.add_evaluation(cid, result(speedup, status, **kw), kind=kind)
        return cid

    def name(self, node) -> str:
        return {v: k for k, v in self.ids.items()}[node.id]
