"""A campaign's configuration (CampaignConfig: every default once), its errors, and its stored problems."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernellab import env
from kernellab.problem import Problem
from kernellab.vocab import DEFAULT_OBJECTIVE, OBJECTIVES

if TYPE_CHECKING:
    pass


class CampaignError(RuntimeError):
    """A campaign that cannot start or continue (bad configuration, unknown campaign)."""


class CampaignBusy(CampaignError):
    """The campaign is being run by another process (or thread) right now."""


# Tuning on a GPU when --tune-trials is not given: Optuna trials per candidate = the candidate budget
# clamped to [TUNE_TRIALS_MIN, TUNE_TRIALS_MAX], so that a longer campaign also tunes each candidate
# longer (a trial is a quick timing, about the cost of one evaluation) and tuning costs at most about as
# many sandbox jobs per candidate as the whole search has candidates. Never more than the SPACE holds.
TUNE_TRIALS_MIN, TUNE_TRIALS_MAX = 4, 32


@dataclass(frozen=True)
class CampaignConfig:
    """A campaign's settings, every default here once (the CLI's options, bench, kernellab.run and the graph's
    Context read them from this class). Frozen: a campaign's configuration is what it was started with."""

    problems: list[str]
    llm: str = "builtin"
    base_url: str | None = None
    budget: int = 8  # candidates per problem (debugger fixes included)
    time_budget_s: float | None = None  # active wall time for the whole campaign
    gpu_budget_s: float | None = None  # summed evaluation time
    usd_budget: float | None = None  # LLM dollars
    policy: str = "greedy"
    seed: int = 0
    trials: int = 5  # correctness trials per evaluation
    width: int = 4  # proposals expanded in parallel per round
    debug_rounds: int = 3
    tune_trials: int | None = None  # Optuna trials per candidate with a SPACE; 0 = none, None = tune_trials_on
    objective: str = DEFAULT_OBJECTIVE
    target: float | None = None  # stop a problem once this speedup is reached
    plateau: int = 8  # stop a problem when its last N new candidates gained < plateau_gain
    plateau_gain: float = 0.01
    device: str | None = None  # None = cuda when available, else cpu
    small: bool | None = None  # None = SMALL sizes on CPU only
    replay: str | None = None  # answer LLM calls from this campaign's recorded calls
    # builtin agents: also seed from torch.compile's own code; None = with CUDA only (on the CPU its
    # Triton kernels run in the interpreter, and compiling costs each problem tens of seconds)
    inductor_seed: bool | None = None
    # evaluate no source that any campaign in the store evaluated already on this device and software
    # with these settings: its result is recorded again, with details.reused_from (search.find_reusable)
    reuse: bool = True

    def validate(self) -> None:
        if not self.problems:
            raise CampaignError("no problem given")
        if self.budget < 1:
            raise CampaignError("--budget must be at least 1")
        if self.width < 1:
            raise CampaignError("--width must be at least 1")
        if self.trials < 1:
            raise CampaignError(f"--trials must be at least 1 (correctness trials per evaluation), got {self.trials}")
        if self.tune_trials is not None and self.tune_trials < 0:
            raise CampaignError(f"--tune-trials must be >= 0 (0: no tuning), got {self.tune_trials}")
        if self.objective not in OBJECTIVES:
            raise CampaignError(f"objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")
        if self.device not in (None, "cpu", "cuda"):
            raise CampaignError(f"--device {self.device!r} is not cpu or cuda")
        if self.device == "cuda" and not env.has_cuda():
            raise CampaignError("--device cuda, but no CUDA device is visible")

    def tune_trials_on(self, device: str) -> int:
        """Optuna trials per candidate with a SPACE on ``device`` ("cuda" or "cpu"): ``tune_trials`` when
        given; else, on a GPU, the candidate budget clamped to [TUNE_TRIALS_MIN, TUNE_TRIALS_MAX], and
        on the CPU none (interpreted timings cannot rank configurations, and each costs minutes)."""
        if self.tune_trials is not None:
            return self.tune_trials
        if not str(device).startswith("cuda"):
            return 0
        return max(TUNE_TRIALS_MIN, min(TUNE_TRIALS_MAX, self.budget))


def _problems_of(store: Any, camp: dict) -> dict[str, Problem]:
    out = {}
    for pid in camp["config"]["problem_ids"]:
        row = store.get_problem(pid)
        out[pid] = Problem(name=row["name"], source=row["source"], path=row["path"])
    return out
