"""LLM-backed agents: the four roles of ``agents/roles.py`` on top of one :class:`Backend`.

Nodes of the tree are named to the model by a *ref*: the first 10 hex digits of the candidate's
``source_hash`` (the hash of problem and source), which is the same in every campaign. Candidate
ids include the campaign id, so naming nodes by id would make every prompt of a replayed campaign
differ from the recorded one.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from kernellab.problem import Problem, content_hash
from kernellab.store import BaseStore

from ..roles import Analysis, Code, Diagnosis, Proposal
from ._anthropic import AnthropicBackend
from ._backend import Backend, CallInfo, ReplaySource
from ._errors import PreflightError
from ._openai import OpenAIBackend
from ._prompts import system_prompt
from ._schemas import SCHEMAS, normalize_source

__all__ = ["LLMAgents", "make_agents", "preflight", "node_ref"]

_MAX_TREE_ROWS = 24  # enough for the planner to see the frontier; more only costs tokens
_MAX_ERROR_CHARS = 6000


def node_ref(problem: Problem, row: dict) -> str:
    h = row.get("source_hash") or content_hash(problem.id, row["source"])
    return h[:10]


def _n(x: Any) -> str:
    """Numbers at 3 significant digits: enough for a decision, stable across timing noise."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def _clip(text: str | None, limit: int = _MAX_ERROR_CHARS) -> str:
    """Head and tail of a long log: the first error and the final traceback both matter."""
    text = text or ""
    if len(text) <= limit:
        return text
    head = limit // 3
    return text[:head] + f"\n... [{len(text) - limit} characters cut] ...\n" + text[-(limit - head):]


def _fence(source: str, lang: str = "python") -> str:
    return f"```{lang}\n{source.rstrip()}\n```"


def _eval_line(ev: dict | None) -> str:
    if not ev:
        return "not evaluated"
    parts = [f"status={ev.get('status')}"]
    if ev.get("status") == "correct":
        parts += [f"median_ms={_n(ev.get('median_ms'))}", f"speedup_eager={_n(ev.get('speedup_eager'))}",
                  f"speedup_compile={_n(ev.get('speedup_compile'))}"]
        if ev.get("interpreted"):
            parts.append("(interpreted: timings not meaningful)")
    else:
        if ev.get("error_class"):
            parts.append(f"error_class={ev['error_class']}")
        first = (ev.get("error_text") or "").strip().splitlines()
        if first:
            parts.append(f"error={first[-1][:160]!r}")
    if ev.get("config"):
        parts.append(f"config={json.dumps(ev['config'], sort_keys=True)}")
    return " ".join(parts)


def _problem_block(problem: Problem) -> str:
    return f"# Problem `{problem.name}` (the reference; your ModelNew must match it)\n{_fence(problem.source)}"


class LLMAgents:
    """Implements :class:`kernellab.agents.roles.Agents` with a model behind ``backend``."""

    def __init__(self, backend: Backend, *, prompts_dir: Path | None = None, skills_dir: Path | None = None):
        self.backend = backend
        self.name = backend.spec
        self._systems = {role: system_prompt(role, prompts_dir, skills_dir) for role in SCHEMAS}
        self.history: list[CallInfo] = []
        self._lock = threading.Lock()

    @property
    def prompt_versions(self) -> dict[str, str]:
        return {role: s.version for role, s in self._systems.items()}

    @property
    def spent_usd(self) -> float:
        return self.backend.spent_usd

    def preflight(self) -> None:
        self.backend.preflight()

    def _ask(self, role: str, user: str, *, context: dict | None = None, replay_key: str,
             candidate_id: str | None = None) -> tuple[dict, CallInfo]:
        system = self._systems[role]
        schema = SCHEMAS[role]
        user += f"\n\nAnswer by calling `{schema.name}` once (or, without tools, with its JSON object only)."
        answer, info = self.backend.complete(
            role, system.text, [{"role": "user", "content": user}], schema, context=context,
            prompt_version=system.version, replay_key=replay_key, candidate_id=candidate_id)
        with self._lock:
            self.history.append(info)
        return answer, info

    @staticmethod
    def _meta(info: CallInfo) -> dict:
        return {"llm_calls": info.call_ids, "prompt_version": info.prompt_version, "attempts": info.attempts,
                "cost_usd": info.cost_usd, "replayed": info.replayed}

    # -- planner ---------------------------------------------------------------------------------
    def plan(self, problem: Problem, tree: list[dict], k: int, reference: dict) -> list[Proposal]:
        by_ref = {node_ref(problem, r): r for r in tree}
        selected = [node_ref(problem, r) for r in tree if r.get("selected")] or list(by_ref)
        lines = [_problem_block(problem), "# Reference profile",
                 f"eager_ms={_n(reference.get('eager_ms'))} compile_ms={_n(reference.get('compile_ms'))}"]
        for op in reference.get("ops") or []:
            lines.append(f"- {op.get('name')}: {_n(op.get('ms'))} ms ({_n(100 * (op.get('share') or 0))}%)")
        if tree:
            def score(r: dict) -> float:
                b = r.get("best") or {}
                if b.get("status") != "correct":
                    return -1.0
                return b.get("speedup_eager") or 0.0
            rows = sorted(tree, key=lambda r: (node_ref(problem, r) not in selected, -score(r)))
            lines.append(f"# Search tree ({len(tree)} nodes; selected first, then best)")
            for r in rows[:_MAX_TREE_ROWS]:
                parent = next((x for x, p in by_ref.items() if p.get("id") == r.get("parent_id")), None)
                lines.append(f"- ref={node_ref(problem, r)} parent={parent or '-'} depth={r.get('depth', 0)} "
                             f"origin={r.get('origin')} language={r.get('language')} "
                             f"action={(r.get('action') or '')[:120]!r}\n  {_eval_line(r.get('best'))}")
                a = r.get("analysis")
                if a:
                    lines.append(f"  analysis: {a.get('bound')}-bound at {_n(a.get('pct_of_ceiling'))}% of "
                                 f"ceiling; ideas: {'; '.join(a.get('next_ideas') or [])[:300]}")
            lines.append(f"# Selected for expansion: {', '.join(selected)}")
            lines.append(f"Propose up to {k} expansions; each `parent` is one of the selected refs.")
        else:
            lines.append(f"# Search tree: empty. Propose up to {k} seed candidates (`parent`: null).")
        key = content_hash(problem.id, ",".join(sorted(selected)) if tree else "seed", str(k))
        answer, info = self._ask("planner", "\n".join(lines), context={"parent_refs": selected if tree else []},
                                 replay_key=key)
        out = []
        for p in answer["proposals"][:k]:
            row = by_ref.get(p["parent"]) if p["parent"] else None
            out.append(Proposal(parent_id=row["id"] if row else None, idea=p["idea"].strip(),
                                rationale=p["rationale"], expected_gain=p["expected_gain"]))
        return out

    # -- coder -----------------------------------------------------------------------------------
    def code(self, problem: Problem, proposal: Proposal, parent: dict | None) -> Code:
        lines = [_problem_block(problem)]
        if parent is not None:
            lines += [f"# Parent candidate ref={node_ref(problem, parent)} ({parent.get('language')}): "
                      f"{_eval_line(parent.get('best'))}", _fence(parent["source"])]
            a = parent.get("analysis")
            if a:
                lines.append(f"Analyst: {a.get('bound')}-bound at {_n(a.get('pct_of_ceiling'))}% of ceiling. "
                             f"{a.get('evidence', '')[:600]}")
        else:
            lines.append("# No parent: write a first candidate from the reference.")
        lines += ["# The change to make", proposal.idea]
        if proposal.rationale:
            lines.append(f"Rationale: {proposal.rationale}")
        lines.append("Write the complete candidate file (CONFIG/SPACE for its tunables).")
        key = content_hash(problem.id, node_ref(problem, parent) if parent else "", proposal.idea)
        answer, info = self._ask("coder", "\n".join(lines), replay_key=key,
                                 candidate_id=parent.get("id") if parent else None)
        return Code(source=normalize_source(answer["source"]), action=answer["action"].strip()[:200],
                    language=answer["language"], origin="llm", model=self.backend.model, meta=self._meta(info))

    # -- debugger --------------------------------------------------------------------------------
    def debug(self, problem: Problem, candidate: dict, evaluation: dict) -> Diagnosis:
        details = evaluation.get("details")
        lines = [_problem_block(problem), f"# Failing candidate ({candidate.get('language')})",
                 _fence(candidate["source"]), "# Evaluation",
                 f"status={evaluation.get('status')} error_class={evaluation.get('error_class') or '-'} "
                 f"max_abs_err={_n(evaluation.get('max_abs_err'))} max_rel_err={_n(evaluation.get('max_rel_err'))}"]
        if evaluation.get("error_text"):
            lines += ["Error text:", _fence(_clip(evaluation["error_text"]), "text")]
        if details:
            lines += ["Details (per-trial errors, first bad indices, integrity reasons):",
                      _fence(_clip(json.dumps(details, sort_keys=True, default=str), 3000), "json")]
        lines.append("Diagnose the failure and return the complete fixed file, or null if it cannot be fixed.")
        key = content_hash(problem.id, node_ref(problem, candidate), str(evaluation.get("status")),
                           str(evaluation.get("error_class")))
        answer, info = self._ask("debugger", "\n".join(lines), replay_key=key, candidate_id=candidate.get("id"))
        source = normalize_source(answer["source"]) if answer["source"] else None
        return Diagnosis(source=source, diagnosis=answer["diagnosis"], action=answer["action"].strip()[:200],
                         meta=self._meta(info))

    # -- profiler-analyst ------------------------------------------------------------------------
    def analyze(self, problem: Problem, candidate: dict, evaluation: dict, metrics: list[dict]) -> Analysis:
        lines = [_problem_block(problem), f"# Candidate ({candidate.get('language')})", _fence(candidate["source"]),
                 "# Evaluation", _eval_line(evaluation),
                 f"eager_ms={_n(evaluation.get('eager_ms'))} compile_ms={_n(evaluation.get('compile_ms'))} "
                 f"own_kernel_share={_n(evaluation.get('own_kernel_share'))} device={evaluation.get('device')}"]
        if metrics:
            lines.append("# Nsight Compute metrics (kernel, metric, value)")
            for m in sorted(metrics, key=lambda m: (str(m.get("kernel")), str(m.get("name"))))[:200]:
                lines.append(f"- {m.get('kernel')} | {m.get('name')} | {_n(m.get('value'))}")
        else:
            lines.append("# No Nsight Compute metrics (ncu unavailable): reason from the timings and sizes.")
        key = content_hash(problem.id, node_ref(problem, candidate))
        answer, info = self._ask("analyst", "\n".join(lines), replay_key=key, candidate_id=candidate.get("id"))
        return Analysis(bound=answer["bound"], pct_of_ceiling=answer["pct_of_ceiling"],
                        evidence=answer["evidence"], next_ideas=list(answer["next_ideas"]))


def _parse_spec(spec: str) -> tuple[str, str]:
    provider, _, model = spec.partition(":")
    if provider not in ("anthropic", "openai") or not model:
        raise PreflightError(f"--llm must be builtin, anthropic:<model> or openai:<model>; got {spec!r}")
    return provider, model


def make_agents(spec: str, *, base_url: str | None = None, store: BaseStore | None = None,
                campaign_id: str | None = None, replay: str | BaseStore | None = None,
                budget_usd: float | None = None, **backend_kw: Any) -> LLMAgents:
    """``spec`` is ``anthropic:<model>`` or ``openai:<model>``. ``replay`` answers every call from
    recorded ``llm_calls`` rows with no network: a campaign id/name in ``store``, or another store
    (any campaign in it). ``backend_kw`` go to the backend (``api_key``, ``http_client``,
    ``max_retries``, ``timeout``, ``max_attempts``, ``max_tokens``, ``prices``). Call ``preflight()``
    before any work."""
    provider, model = _parse_spec(spec)
    source = None
    if isinstance(replay, str):
        if store is None:
            raise PreflightError("--replay needs the database holding the replayed campaign")
        camp = store.get_campaign(replay)
        if camp is None:
            raise PreflightError(f"no campaign {replay!r} to replay in this database")
        source = ReplaySource(store, camp["id"])
    elif replay is not None:
        source = ReplaySource(replay)
    common = dict(store=store, campaign_id=campaign_id, replay=source, budget_usd=budget_usd, **backend_kw)
    if provider == "anthropic":
        backend: Backend = AnthropicBackend(model, base_url=base_url, **common)
    else:
        backend = OpenAIBackend(model, base_url=base_url, **common)
    return LLMAgents(backend)


def preflight(spec: str, *, base_url: str | None = None, **kw: Any) -> None:
    """Check ``spec`` can be used (key, server, model) without doing any work; raise PreflightError."""
    make_agents(spec, base_url=base_url, **kw).preflight()
