"""The campaign's evaluate, tune, profile and reference steps, which the graph calls through its Context."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import as_completed
from typing import TYPE_CHECKING, Any

from kernellab import env
from kernellab.campaign.config import CampaignConfig
from kernellab.problem import Problem
from kernellab.vocab import small_for

if TYPE_CHECKING:
    from kernellab.store import BaseStore


class _Steps:
    """The campaign's evaluate, tune, profile and reference steps (the graph calls them through its Context)."""

    def __init__(self, store: BaseStore, campaign_id: str, config: CampaignConfig, executor: Any, device: str):
        self.store, self.campaign_id, self.config, self.executor, self.device = store, campaign_id, config, executor, device
        self._references: dict[str, dict] = {}
        self.tune_trials = config.tune_trials_on(device)
        self._early: dict[str, Any] = {}  # candidate id -> its judged evaluation's future, submitted as it was written
        self._early_lock = threading.Lock()
        self._storage_warm = False  # Optuna's storage made ahead of the first tuning (search.prewarm_storage)

    def _settings(self, problem: Problem) -> dict:
        from kernellab import search

        small = small_for(self.device, self.config.small)
        return search.reuse_settings(trials=self.config.trials, small=small, mode=problem.mode)

    def _reusable(self, problem: Problem, cand: dict) -> dict | None:
        """A finished evaluation of the same source by any campaign, made under this campaign's
        conditions (``search.find_reusable``), as this candidate's result; None: evaluate it.
        Only with an executor whose workers run this host's device and software (``Executor.runs_here``)."""
        from kernellab import search

        if not self.config.reuse or not self.executor.runs_here():
            return None
        known = search.find_reusable(self.store, problem.id, cand["source"], device=env.device_name(self.device),
                                     versions=env.versions(self.device), job=self._settings(problem),
                                     gpu=self.device == "cuda", exclude=cand["id"])
        return search.reused_result(known) if known is not None else None

    def start_evaluation(self, problem: Problem, cand: dict) -> None:
        """Submit a candidate's judged evaluation as soon as the code step writes it; :meth:`evaluate_many`
        collects it. The evaluate step begins after the whole code step, which waits for the Inductor seed's
        compile: in a solo run on the H200 the builtin seed's evaluation waited 10.4 s for it."""
        if self._reusable(problem, cand) is not None:
            return  # evaluate_many records the reused result
        fut = self._submit(problem, cand)
        with self._early_lock:
            self._early[cand["id"]] = fut

    def _submit(self, problem: Problem, cand: dict) -> Any:
        """A candidate's judged evaluation, submitted (``sandbox.evaluate``'s job, its future not waited on)."""
        from kernellab import sandbox

        if self.tune_trials > 0 and not self._storage_warm:
            # made while the campaign waits for its first evaluation (the first tuning otherwise does)
            self._storage_warm = True
            from kernellab import search

            search.prewarm_storage(self.store)
        return self.executor.submit(sandbox.EvalJob(problem=problem, source=cand["source"], small=self.config.small,
                                                    device=self.device, trials=self.config.trials, store=self.store))

    def _started(self, cand_id: str) -> Any:
        with self._early_lock:
            return self._early.pop(cand_id, None)

    def evaluate_many(self, problem: Problem, cands: list[dict]) -> Iterator[tuple[str, dict]]:
        todo = []
        for c in cands:
            reused = self._reusable(problem, c)
            if reused is None:
                todo.append(c)
            else:
                yield c["id"], reused
        if not todo:
            return
        job_settings = self._settings(problem)
        # the executor's futures, in flight together (those the code step submitted already among them); on
        # Ctrl-C nothing here waits: the executor's shutdown kills their workers
        futs = {(self._started(c["id"]) or self._submit(problem, c)): c["id"] for c in todo}
        for fut in as_completed(futs):
            result = fut.result()
            # what a later campaign's reuse compares with (search.find_reusable)
            result["details"] = {**(result.get("details") or {}), "settings": job_settings}
            yield futs[fut], result

    def tune(self, problem: Problem, cand: dict, deadline: float | None = None) -> dict | None:
        from kernellab import search

        config = self.config
        if self.tune_trials <= 0:
            return None
        # search.tune returns TuneResult.to_dict() already
        return search.tune(problem, cand, store=self.store, executor=self.executor, n_trials=self.tune_trials,
                           seed=config.seed, small=config.small, device=self.device, deadline=deadline,
                           objective=config.objective)

    def profile(self, problem: Problem, cand: dict, best: dict) -> tuple[list, str | None]:
        from kernellab import sandbox

        if self.device != "cuda":
            return [], "no CUDA device: Nsight Compute profiling skipped"
        small = bool(self.config.small)
        config = best.get("config") or None
        rows = self.executor.remote_profile(problem, cand["source"], config=config, small=small)
        if rows is not None:  # a cluster: ncu ran on a worker's GPU, held there as a timing holds it
            return list(rows), getattr(rows, "reason", None)
        # the GPU to itself for the profiled forward, as a timing has it: no other job's trials run under
        # the profiler's replays (the profiled process's start-up and warm-up share the GPU)
        with self.executor.profiling(problem, small=small) as gate:
            rows = sandbox.profile(problem, cand["source"], config=config, small=small,
                                   gpu=gate.gpu, gate=gate if gate.gpu is not None else None)
        return rows, getattr(rows, "reason", None)  # a ProfileResult: its `seconds` go in the profile event

    def reference(self, problem: Problem) -> dict:
        """The reference's op profile for the planner: the one recorded for this problem (a ``reference``
        event, so a resume plans alike), else the builtin cost model's of its captured graph (H200
        shares, also on a CPU whose own op times would say nothing about the GPU)."""
        if problem.id not in self._references:
            known = [e["payload"] for e in self.store.events(self.campaign_id, "reference")
                     if e["payload"].get("problem_id") == problem.id]
            if known:
                prof = known[-1].get("profile") or {}
            else:
                from kernellab.agents.builtin import modelled

                prof = modelled.reference_profile(problem)
                self.store.add_event(self.campaign_id, "reference", {"problem_id": problem.id, "profile": prof})
            self._references[problem.id] = prof
        return self._references[problem.id]
