"""Campaigns: start one over problem files, run it through the agent graph, resume it after a stop,
a crash or ``kill -9``. The LangGraph checkpoints live in the campaign's own database
(``SqliteSaver``, ``thread_id`` = campaign id), next to the store's tables.

One process at a time runs a campaign: :func:`campaign_lock` (an ``flock`` on a file next to the
database, which the kernel drops when its holder dies, ``kill -9`` included). At its end each
problem's winner is re-timed in a fresh job (:func:`retime_winners`); that re-timing is the number
``status``, ``report``, ``export`` and ``bench`` print (``store.reported_best``).

The modules: ``config`` (CampaignConfig, the errors), ``running`` (start, check, run, resume, mark stopped),
``steps`` (evaluate, tune, profile, reference), ``lock`` (campaign_lock), ``timeline`` (step times), ``retime``
(the winners re-timed) and ``api`` (``kernellab.run``). This module only re-exports.
"""

from __future__ import annotations

from kernellab.campaign.api import problems_to_run, run
from kernellab.campaign.config import TUNE_TRIALS_MAX, TUNE_TRIALS_MIN, CampaignBusy, CampaignConfig, CampaignError
from kernellab.campaign.lock import campaign_lock, is_held, is_stale
from kernellab.campaign.retime import retime_winners, retimes_missing
from kernellab.campaign.running import (
    PROBLEM_FAULT,
    check_campaign,
    make_agents,
    mark_stopped,
    mark_stopped_here,
    problem_fault,
    resume_campaign,
    run_campaign,
    start_campaign,
)
from kernellab.campaign.timeline import format_step_times, step_times, step_times_line

__all__ = ["CampaignConfig", "TUNE_TRIALS_MIN", "TUNE_TRIALS_MAX", "check_campaign", "start_campaign", "run_campaign",
           "resume_campaign", "CampaignError", "CampaignBusy", "campaign_lock", "is_held", "is_stale", "retime_winners", "retimes_missing", "run", "step_times",
           "step_times_line", "format_step_times", "mark_stopped", "mark_stopped_here", "PROBLEM_FAULT", "problem_fault", "make_agents",
           "problems_to_run"]
