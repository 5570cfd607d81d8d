"""Answer validation, source checks, prompt versions, prices and key scrubbing: no network, no SDK."""

from __future__ import annotations

import shutil

import pytest

from kernellab.agents.llm import PRICES_DATE, SCHEMAS, check_source, price_for, scrub, system_prompt
from kernellab.agents.llm._prompts import PROMPTS_DIR, ROLE_SKILLS, SKILLS_DIR
from kernellab.agents.llm._schemas import normalize_source, validate

GOOD = '''import torch

CONFIG = {"BLOCK": 128}
SPACE = {"BLOCK": [64, 128, 256], "WARPS": (1, 8)}


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x * 2
'''


@pytest.mark.parametrize("source, fragment", [
    (GOOD.replace("class ModelNew", "class Faster"), "defines no module-level `class ModelNew"),
    (GOOD.replace("def forward(self, x):", "def fwd(self, x):"), "defines no `forward`"),
    (GOOD.replace("return x * 2", "return super().forward(x)"), "calls the reference `Model.forward`"),
    (GOOD.replace("return x * 2", "return x *"), "does not parse: line 9"),
    (GOOD.replace('CONFIG = {"BLOCK": 128}\n', ""), "`SPACE` is defined without `CONFIG`"),
    (GOOD.replace('[64, 128, 256]', '[]'), "SPACE['BLOCK']` must be a non-empty list"),
    (GOOD.replace('{"BLOCK": 128}', 'dict(BLOCK=128)'), "`CONFIG` must be a literal dict"),
])
def test_check_source_names_the_problem(source, fragment):
    problems = check_source(source)
    assert any(fragment in p for p in problems), problems


def test_check_source_accepts_a_good_file_and_spots_space_names_missing_from_config():
    assert check_source(GOOD) == ["`SPACE` names ['WARPS'] which `CONFIG` lacks"]
    assert check_source(GOOD.replace('{"BLOCK": 128}', '{"BLOCK": 128, "WARPS": 4}')) == []


@pytest.mark.parametrize("wrapped", ["```python\n{}\n```", "```\n{}\n```", "\n```py\n{}\n```\n", "{}"])
def test_fenced_sources_are_unwrapped(wrapped):
    assert normalize_source(wrapped.format(GOOD.strip())) == GOOD


@pytest.mark.parametrize("answer, fragment", [
    ({"bound": "memory", "pct_of_ceiling": 50, "evidence": "x"}, "missing required field 'next_ideas'"),
    ({"bound": "disk", "pct_of_ceiling": 50, "evidence": "x", "next_ideas": []}, "'disk' is not one of"),
    ({"bound": "memory", "pct_of_ceiling": "50%", "evidence": "x", "next_ideas": []}, "expected number or null"),
    ({"bound": "memory", "pct_of_ceiling": 500, "evidence": "x", "next_ideas": []}, "above the maximum 150"),
    ({"bound": "memory", "pct_of_ceiling": None, "evidence": "x", "next_ideas": [3]}, "answer.next_ideas[0]"),
    ({"bound": "memory", "pct_of_ceiling": None, "evidence": "x", "next_ideas": [], "extra": 1},
     "unexpected field 'extra'"),
    ([], "expected object"),
])
def test_validate_reports_the_path(answer, fragment):
    problems = validate(answer, SCHEMAS["analyst"].schema)
    assert any(fragment in p for p in problems), problems


def test_planner_parent_must_be_a_selected_node():
    answer = {"proposals": [{"parent": "abc", "idea": "x", "rationale": "", "expected_gain": None}]}
    assert SCHEMAS["planner"].problems(answer, {"parent_refs": ["abc"]}) == []
    (p,) = SCHEMAS["planner"].problems(answer, {"parent_refs": ["def"]})
    assert "'abc' is not one of the nodes selected" in p and "def" in p
    (p,) = SCHEMAS["planner"].problems(answer, {"parent_refs": []})
    assert "tree is empty" in p


def test_schemas_fit_strict_mode():
    """OpenAI strict mode and Anthropic strict tools need every property required and no extras."""
    def walk(s):
        if s.get("type") == "object":
            assert set(s["required"]) == set(s["properties"]) and s["additionalProperties"] is False
            for sub in s["properties"].values():
                walk(sub)
        if s.get("type") == "array":
            walk(s["items"])
    for schema in SCHEMAS.values():
        walk(schema.schema)


def test_prompt_version_follows_the_content(tmp_path):
    prompts, skills = tmp_path / "prompts", tmp_path / "skills"
    shutil.copytree(PROMPTS_DIR, prompts)
    shutil.copytree(SKILLS_DIR, skills)
    before = {r: system_prompt(r, prompts, skills).version for r in ROLE_SKILLS}
    assert before == {r: system_prompt(r).version for r in ROLE_SKILLS}
    (skills / "roofline.md").write_text((skills / "roofline.md").read_text() + "\nOne more line.\n")
    after = {r: system_prompt(r, prompts, skills).version for r in ROLE_SKILLS}
    changed = {r for r in ROLE_SKILLS if before[r] != after[r]}
    assert changed == {r for r, names in ROLE_SKILLS.items() if "roofline" in names}


def test_every_role_prompt_carries_its_skills():
    for role, names in ROLE_SKILLS.items():
        text = system_prompt(role).text
        assert all(f'<skill name="{n}">' in text for n in names)


@pytest.mark.parametrize("model, inp, out, read", [
    ("claude-sonnet-4-6", 3.0, 15.0, 0.30), ("claude-haiku-4-5-20251001", 1.0, 5.0, 0.10),
    ("claude-opus-4-1-20250805", 15.0, 75.0, 1.50), ("claude-sonnet-5-5", 2.0, 10.0, 0.10),
])
def test_prices(model, inp, out, read):
    p = price_for(model)
    assert (p.input, p.output, p.cache_read, p.cache_write_5m, p.cache_write_1h) == (
        inp, out, read, inp * 1.25, inp * 2)
    assert PRICES_DATE.count("-") == 2 and price_for("gpt-unknown") is None


def test_scrub_removes_secrets_and_key_shapes():
    data = {"a": "key=abcdefgh12345678 and sk-ant-api03-xyzXYZ0123456789", "b": ["sk-proj-" + "A" * 30], "c": 3}
    out = scrub(data, ("abcdefgh12345678",))
    assert out == {"a": "key=[REDACTED] and [REDACTED]", "b": ["[REDACTED]"], "c": 3}
