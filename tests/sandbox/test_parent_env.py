"""A candidate must not read credentials out of the process that started its worker.

The worker's own environment is scrubbed (test_adversarial's writes_env); this covers the parent's
``/proc/<ppid>/environ``, which keeps the environment the parent started with. The parent here is a
fresh interpreter started with a fake key, as `ANTHROPIC_API_KEY=... kernellab run` would be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-ant-fake-parent-0123456789"

CANDIDATE = textwrap.dedent('''
    import json, os
    import torch

    class Model(torch.nn.Module):
        def forward(self, x):
            return x + 1.0

    CONFIG = {"OUT": ""}

    class ModelNew(Model):
        def forward(self, x):
            found = {}
            for what in ("environ", "mem"):
                try:
                    with open(f"/proc/{os.getppid()}/{what}", "rb") as f:
                        found[what] = f.read(1 << 16).decode("utf-8", "replace")
                except OSError as e:
                    found[what] = f"refused: {type(e).__name__}"
            with open(CONFIG["OUT"], "w") as f:
                json.dump(found, f)
            return x + 1.0
''')

PROBLEM = textwrap.dedent('''
    import torch

    class Model(torch.nn.Module):
        def forward(self, x):
            return x + 1.0

    def get_inputs():
        return [torch.randn(8, 8)]

    def get_init_inputs():
        return []
''')

PARENT = textwrap.dedent('''
    import json, subprocess, sys
    from kernellab import load_problem
    from kernellab.sandbox import EvalJob, LocalExecutor

    # control: before any executor exists, a child of ours can read our environment
    probe = "import os; print(open(f'/proc/{os.getppid()}/environ', 'rb').read().decode('utf-8', 'replace'))"
    before = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout

    out, cand, problem = sys.argv[1], sys.argv[2], load_problem(sys.argv[3])
    with LocalExecutor(cpu_workers=1) as ex:
        r = ex.submit(EvalJob(problem, open(cand).read(), config={"OUT": out}, device="cpu", trials=1,
                              timing=False)).result()
    print(json.dumps({"status": r["status"], "error": r["error_text"], "control": before}))
''')


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
def test_candidate_cannot_read_the_parents_environment(tmp_path):
    prob = tmp_path / "plus_one.py"
    prob.write_text(PROBLEM)
    cand = tmp_path / "cand.py"
    cand.write_text(CANDIDATE)
    out = tmp_path / "found.json"
    env = dict(os.environ, ANTHROPIC_API_KEY=SECRET, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-c", PARENT, str(out), str(cand), str(prob)], env=env, capture_output=True,
                         text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(run.stdout.strip().splitlines()[-1])
    assert res["status"] == "correct", res["error"]
    if SECRET not in res["control"]:
        pytest.skip("this kernel already hides a parent's /proc/<pid>/environ from its children")
    found = json.loads(out.read_text())
    assert SECRET not in json.dumps(found)
    assert found["environ"].startswith("refused"), found["environ"][:200]
