"""``kernellab study SUITE``: a matrix of search strategies run over one suite into one database.

A study is the cross product policy x agents x seed; each element is a *cell*, and a cell is one
``bench`` of the suite (``kernellab.bench.run_bench``: one campaign per problem) under that cell's
configuration. The bench machinery gives the study its incrementality: a cell's problems already
finished under the same configuration hash are skipped, unfinished ones resumed, the rest started;
so a rerun of a finished study runs nothing, and a rerun with one more policy runs only that policy.

For LLM agents the content hash of the prompts and skills (``kernellab/agents/prompts``, ``kernellab/agents/skills``) enters
the cell's configuration hash: after an edit of a prompt the same command runs the cells again (and
``kernellab compare --by prompts`` sets the two versions side by side) instead of skipping them as
finished.

Records: the ``strategy_studies`` table holds the study's suite, shared settings and every cell with its
configuration hash (``compare --study`` reads the whole matrix from it, unfinished cells included);
each campaign's config carries ``study = {names, cell, policy, agents, seed, prompts}``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernellab import _runtime
from kernellab.bench import RESULTS, bench_campaigns, bench_config, config_hash, run_bench, suite_paths
from kernellab.campaign import CampaignConfig
from kernellab.problem import load_problem

__all__ = ["StudyError", "Cell", "plan_cells", "run_study", "study_status", "cell_campaigns"]

# the settings a cell sets; everything else is shared by the whole study
_CELL_KEYS = ("policy", "llm", "seed")


class StudyError(ValueError):
    """Bad study input (unknown policy, an existing study with other settings): one line, exit 2."""


@dataclass(frozen=True)
class Cell:
    policy: str
    agents: str  # "builtin" or an LLM backend spec ("anthropic:<model>", "openai:<model>")
    seed: int
    prompts: str | None = None  # content hash of the prompts and skills, for LLM agents

    @property
    def key(self) -> str:
        return f"{self.policy}|{self.agents}|s{self.seed}" + (f"|p{self.prompts}" if self.prompts else "")

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9.]+", "-", self.key).strip("-")

    @property
    def strategy(self) -> str:
        """The cell without its seed: what compare sets against the other strategies."""
        return f"{self.policy} · {self.agents}"

    def config_kw(self, base: dict) -> dict:
        return {**base, "policy": self.policy, "llm": self.agents, "seed": self.seed}

    def extra(self) -> dict:
        return {"prompts": self.prompts} if self.prompts else {}

    def config_hash(self, base: dict) -> str:
        return config_hash({**bench_config(self.config_kw(base)), **self.extra()})


def parse_list(text: str | Sequence[str], what: str) -> list[str]:
    """``"a,b"`` (or a sequence of such) -> ``["a", "b"]``, order kept, duplicates dropped."""
    items = [text] if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if part and part not in out:
                out.append(part)
    if not out:
        raise StudyError(f"{what}: give at least one value (comma-separated)")
    return out


def plan_cells(policies: Sequence[str], agents: Sequence[str], seeds: Sequence[int]) -> list[Cell]:
    """Seed-major order: every strategy's seed 0 runs before any seed 1, so a study stopped half-way
    holds complete pairs for the seeds it finished."""
    from kernellab import search

    bad = [p for p in policies if p not in search.POLICIES]
    if bad:
        raise StudyError(f"--policy {','.join(bad)!r}: not one of {', '.join(sorted(search.POLICIES))}")
    bad = [a for a in agents if a != "builtin" and not re.fullmatch(r"(anthropic|openai):\S+", a)]
    if bad:
        raise StudyError(f"--agents {','.join(bad)!r}: each is builtin, anthropic:<model> or openai:<model>")
    if all(a == "builtin" for a in agents):  # the builtin agents read no prompt (None); no LLM package imported
        versions: dict[str, str | None] = dict.fromkeys(agents)
    else:
        from kernellab.agents.llm import prompts_version

        versions = {a: prompts_version(a) for a in agents}
    return [Cell(p, a, s, versions[a]) for s in seeds for a in agents for p in policies]


def _shared(config_kw: dict) -> dict:
    """The study's settings shared by every cell, resolved as bench resolves them (device, SMALL)."""
    cfg = bench_config({**config_kw, "policy": "greedy", "llm": "builtin", "seed": 0})
    for k in _CELL_KEYS:
        cfg.pop(k)
    return cfg


def _record(store: Any, name: str, suite: str, problems: list[dict], shared: dict, cells: list[Cell],
            base: dict) -> dict:
    """Create the study, or grow an existing one by the new cells; refuse one whose suite or shared
    settings differ (its cells would not be comparable)."""
    old = store.get_study(name)
    entries = {c["key"]: c for c in ((old or {}).get("config") or {}).get("cells", [])}
    if old is not None:
        prev = old["config"]
        if prev.get("suite") != suite or [p["id"] for p in prev.get("problems", [])] != [p["id"] for p in problems]:
            raise StudyError(f"study {name!r} exists over another suite ({prev.get('suite')}); give another --name")
        diff = sorted(k for k in set(prev.get("shared", {})) | set(shared)
                      if prev.get("shared", {}).get(k) != shared.get(k))
        if diff:
            changes = ", ".join(f"{k}: {prev.get('shared', {}).get(k)!r} -> {shared.get(k)!r}" for k in diff)
            raise StudyError(f"study {name!r} was run with other settings ({changes}); give another --name")
    for c in cells:
        entries[c.key] = {"key": c.key, "policy": c.policy, "agents": c.agents, "seed": c.seed,
                          "prompts": c.prompts, "strategy": c.strategy, "config_hash": c.config_hash(base)}
    config = {"suite": suite, "problems": problems, "shared": shared, "cells": list(entries.values())}
    store.put_study(name, suite, config)
    return config


def cell_campaigns(store: Any, entry: dict, problem_ids: Sequence[str]) -> dict[str, dict]:
    """problem id -> the campaign that counts for this cell (bench's rule: the latest finished one,
    else the latest unfinished one), for the study's problems."""
    out = {}
    index = bench_campaigns(store, entry["config_hash"])
    for pid in problem_ids:
        camps = sorted(index.get(pid, []), key=lambda c: (c["status"] == "done", c["updated_at"] or ""))
        if camps:
            out[pid] = camps[-1]
    return out


def _tag(store: Any, name: str, cell: Cell, camps: dict[str, dict]) -> None:
    """Name the study in each campaign of the cell, also in those reused from an earlier study or bench
    under the same configuration (a campaign may serve several studies)."""
    for camp in camps.values():
        tag = dict(camp["config"].get("study") or {})
        names = list(tag.get("names") or [])
        if name in names and tag.get("cell") == cell.key:
            continue
        tag.update(names=names + ([name] if name not in names else []), cell=cell.key, policy=cell.policy,
                   agents=cell.agents, seed=cell.seed, prompts=cell.prompts)
        store.update_campaign(camp["id"], config={**camp["config"], "study": tag})


def study_status(store: Any, name: str) -> dict:
    """Per cell: how many of the suite's problems have a finished campaign."""
    row = store.get_study(name)
    if row is None:
        raise StudyError(f"no study {name!r} in {store.path}")
    cfg = row["config"]
    pids = [p["id"] for p in cfg["problems"]]
    cells = []
    for entry in cfg["cells"]:
        camps = cell_campaigns(store, entry, pids)
        cells.append({**entry, "problems": len(pids), "finished": sum(c["status"] == "done" for c in camps.values()),
                      "campaigns": {pid: c["name"] for pid, c in camps.items()}})
    done = sum(c["finished"] for c in cells)
    total = len(pids) * len(cells)
    return {"study": name, "suite": cfg["suite"], "shared": cfg["shared"], "cells": cells,
            "campaigns_finished": done, "campaigns_total": total, "complete": done == total}


def run_study(suite: str, store: Any, *, name: str | None = None, policies: Sequence[str],
              agents: Sequence[str] = ("builtin",), seeds: int | Sequence[int] = 2, config_kw: dict | None = None,
              jobs: int = 1, out_dir: Path | None = None, progress: Any = None,
              log: Callable[[str], None] | None = None) -> dict:
    """Run every cell of the matrix that is not finished yet (see the module's docstring); returns
    :func:`study_status` plus ``ran``: per cell, how many problems were skipped, resumed or started."""
    _runtime.setup()  # before the campaign threads start (they parse sources): kernellab._runtime
    say = log or (lambda msg: None)
    # cells are compared with each other: a cell that took its evaluations from a cell run before it
    # (cross-campaign reuse) would reach its best in fewer seconds for no merit of its own strategy
    config_kw = {**(config_kw or {}), "reuse": False}
    for k in ("policy", "llm", "seed", "replay"):
        if config_kw.pop(k, None) not in (None, "greedy", "builtin", 0):
            raise StudyError(f"{k!r} is set per cell by the study (--policy, --agents, --seeds), not shared")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not seed_list or any(s < 0 for s in seed_list):
        raise StudyError(f"--seeds must be at least 1, got {seeds}")
    paths = suite_paths(suite)
    problems = [load_problem(p) for p in paths]  # all-or-nothing, before anything is written
    CampaignConfig(problems=[str(p) for p in paths], **config_kw).validate()
    cells = plan_cells(list(policies), list(agents), seed_list)
    name = name or f"{Path(suite).stem}-study"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise StudyError(f"--name {name!r}: letters, digits, '.', '_' and '-' only")
    probs = [{"id": p.id, "name": p.name, "path": str(path)} for p, path in zip(problems, paths, strict=True)]
    _record(store, name, suite, probs, _shared(config_kw), cells, config_kw)
    out = Path(out_dir) if out_dir is not None else RESULTS / f"study-{name}"
    pids = [p.id for p in problems]
    ran = []
    say(f"study {name}: {len(cells)} cells ({len(set(c.policy for c in cells))} policies x "
        f"{len(set(c.agents for c in cells))} agents x {len(seed_list)} seeds) x {len(problems)} problems")
    for i, cell in enumerate(cells, 1):
        entry = {"config_hash": cell.config_hash(config_kw)}
        before = cell_campaigns(store, entry, pids)
        n_done = sum(c["status"] == "done" for c in before.values())
        say(f"study {name}: cell {i}/{len(cells)} {cell.key}: {n_done}/{len(pids)} problems finished before")
        if n_done < len(pids):
            tag = {"study": {"names": [name], "cell": cell.key, "policy": cell.policy, "agents": cell.agents,
                             "seed": cell.seed, "prompts": cell.prompts}}
            run_bench(suite, store, cell.config_kw(config_kw), name=f"{name}-{cell.slug}", out_dir=out,
                      progress=progress, jobs=jobs, log=log, extra=cell.extra(), tag=tag)
        after = cell_campaigns(store, entry, pids)
        _tag(store, name, cell, after)
        ran.append({"cell": cell.key, "skipped": n_done,
                    "resumed": sum(1 for pid, c in before.items() if c["status"] != "done"),
                    "started": sum(1 for pid in after if pid not in before)})
    status = study_status(store, name)
    status["ran"] = ran
    say(f"study {name}: {status['campaigns_finished']}/{status['campaigns_total']} campaigns finished; "
        f"`kernellab compare --study {name}` compares them")
    return status
