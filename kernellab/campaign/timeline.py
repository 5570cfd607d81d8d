"""Where a campaign's time went: its steps' times, summed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernellab.campaign.config import CampaignError

if TYPE_CHECKING:
    pass


def step_times(store: Any, campaign: str) -> dict:
    """A campaign's time summed by step, from its ``step`` events (``agents.graph.timed_step``; every
    session's, a resumed campaign's included): ``steps`` (step, seconds, count, max_s; a step nested in
    another, such as the planner's reference profile, is not in its parent's sum twice but under
    ``parts``), ``parts`` (labelled steps: the Inductor seed's compile, the reference profile) and
    ``evaluation_phases`` (the evaluations' wall seconds by sandbox phase: load, reference, baseline,
    compile, timing, waits for the GPU's lock...), ``inductor_seeds`` (each seed's seconds by part, as its
    candidate keeps them) and ``startup_age_s`` (the first session's process age at each point of its start-up,
    where it was recorded). Seconds of parallel tasks (``code``) add up."""
    camp = store.get_campaign(campaign)
    if camp is None:
        raise CampaignError(f"no campaign {campaign!r}")

    def add(table: dict, key: tuple, step: str, label: str | None, sec: float) -> None:
        row = table.setdefault(key, {"step": step, "label": label, "seconds": 0.0, "count": 0, "max_s": 0.0})
        row["seconds"] += sec
        row["count"] += 1
        row["max_s"] = max(row["max_s"], sec)

    steps: dict = {}
    parts: dict = {}
    phases: dict[str, float] = {}
    for e in store.events(camp["id"], "step"):
        p = e["payload"]
        sec = float(p.get("seconds") or 0.0)
        if not p.get("within"):
            add(steps, (p["step"],), p["step"], None, sec)
        if p.get("label"):
            add(parts, (p["step"], p["label"]), p.get("within") or p["step"], p["label"], sec)
        for ph, v in (p.get("phases") or {}).items():
            phases[ph] = phases.get(ph, 0.0) + float(v)
    rnd = lambda rows: [{**r, "seconds": round(r["seconds"], 3), "max_s": round(r["max_s"], 3)}  # noqa: E731
                        for r in sorted(rows, key=lambda r: -r["seconds"])]
    # each Inductor seed's own account (its candidate's meta.inductor.seconds): admission, the child's imports,
    # its time with and without the GPU's share
    seeds = [{"candidate_id": c["id"], "seconds": ((c.get("meta") or {}).get("inductor") or {}).get("seconds")}
             for c in store.candidates(camp["id"]) if c.get("origin") == "inductor"]
    return {"campaign": camp["name"], "steps": rnd(steps.values()), "parts": rnd(parts.values()),
            "evaluation_phases": {k: round(v, 3) for k, v in sorted(phases.items(), key=lambda kv: -kv[1])},
            "inductor_seeds": [s for s in seeds if s["seconds"]],
            "startup_age_s": next((e["payload"].get("startup_age_s") for e in store.events(camp["id"], "session")
                                   if e["payload"].get("startup_age_s")), None)}


def step_times_line(summary: dict, n: int = 6) -> str:
    """The largest steps of :func:`step_times` on one line (the campaign's last progress line)."""
    return ", ".join(f"{r['step']} {r['seconds']:.0f} s" for r in summary["steps"][:n]) or "no steps recorded"


def format_step_times(summary: dict) -> str:
    """:func:`step_times` as text: one line per step, its labelled parts under it, then the phases."""
    lines = [f"campaign {summary['campaign']}: seconds by step (parallel code tasks add up)"]
    if summary.get("startup_age_s"):
        lines.append("  start-up, the process's age at each point: "
                     + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(summary["startup_age_s"].items(),
                                                                      key=lambda kv: kv[1])))
    for r in summary["steps"]:
        lines.append(f"  {r['step']:<10} {r['seconds']:9.1f} s  {r['count']:4d} x, longest {r['max_s']:.1f} s")
        for p in summary["parts"]:
            if p["step"] == r["step"]:
                lines.append(f"    {p['label']:<28} {p['seconds']:9.1f} s  {p['count']:4d} x, longest {p['max_s']:.1f} s")
    for seed in summary.get("inductor_seeds") or []:
        lines.append(f"  Inductor seed {seed['candidate_id'][:10]} by part: "
                     + ", ".join(f"{k} {v:.1f} s" for k, v in seed["seconds"].items()))
    if summary["evaluation_phases"]:
        lines.append("  evaluations by sandbox phase: "
                     + ", ".join(f"{k} {v:.1f} s" for k, v in summary["evaluation_phases"].items()))
    return "\n".join(lines)
