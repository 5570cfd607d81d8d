"""Role prompts (``agents/prompts/<role>.md``) and skills (``agents/skills/<name>.md``) as files,
versioned by content hash. The system prompt of a role is its prompt followed by its skills: it is
static across a campaign, so the Anthropic backend marks it for prompt caching."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kernellab.problem import content_hash

from ._schemas import SCHEMAS

__all__ = ["PROMPTS_DIR", "SKILLS_DIR", "ROLE_SKILLS", "SystemPrompt", "prompts_version", "system_prompt"]

_ROOT = Path(__file__).resolve().parent.parent
PROMPTS_DIR = _ROOT / "prompts"
SKILLS_DIR = _ROOT / "skills"

# Which skills each role reads. The analyst needs the ceilings, not the code recipes.
ROLE_SKILLS: dict[str, tuple[str, ...]] = {
    "planner": ("contract", "integrity", "triton_hopper", "cuda_cupy", "roofline"),
    "coder": ("contract", "integrity", "triton_hopper", "cuda_cupy"),
    "debugger": ("contract", "integrity", "triton_hopper", "cuda_cupy"),
    "analyst": ("roofline", "triton_hopper"),
}


@dataclass(frozen=True)
class SystemPrompt:
    role: str
    text: str
    version: str  # "<role>-<hash of prompt, skills and schema>": recorded per call


def _read(path: Path) -> str:
    if not path.exists():
        raise FileNotFoundError(f"{path}: prompt file missing (the package data is incomplete)")
    return path.read_text()


def system_prompt(role: str, prompts_dir: Path | None = None, skills_dir: Path | None = None) -> SystemPrompt:
    if role not in ROLE_SKILLS:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLE_SKILLS)}")
    prompts_dir = prompts_dir or PROMPTS_DIR
    skills_dir = skills_dir or SKILLS_DIR
    parts = [_read(prompts_dir / f"{role}.md").strip()]
    for name in ROLE_SKILLS[role]:
        parts.append(f"<skill name=\"{name}\">\n{_read(skills_dir / f'{name}.md').strip()}\n</skill>")
    text = "\n\n".join(parts) + "\n"
    schema = json.dumps(SCHEMAS[role].schema, sort_keys=True)
    return SystemPrompt(role, text, f"{role}-{content_hash(text, schema, n=12)}")


def prompts_version(agents: str) -> str | None:
    """The content hash of every role's system prompt (prompt, skills, answer schema) the LLM agents
    would send now; None for the builtin agents (``agents == "builtin"``), which read no prompt. A campaign
    records it (``kernellab compare --by prompts`` groups by it) and a study's cells are keyed by it."""
    if agents == "builtin":
        return None
    return content_hash(*(system_prompt(role).version for role in sorted(ROLE_SKILLS)), n=12)
