"""The structured answer of each role: a JSON schema (sent to the model as a forced tool or a JSON
schema response format), a small validator for it, and semantic checks (e.g. code must define
``class ModelNew``). Every problem is phrased as a sentence the model can act on: the backend sends
the list back in its retry message.

The schemas keep to the subset both providers' strict modes accept: every property required,
``additionalProperties: false``, nullability as ``["string", "null"]``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RoleSchema", "SCHEMAS", "validate", "check_source", "normalize_source"]

Check = Callable[[dict, dict], list[str]]  # (answer, context) -> problems


@dataclass(frozen=True)
class RoleSchema:
    role: str
    name: str  # the tool / response-format name
    description: str
    schema: dict
    check: Check | None = field(default=None, compare=False)

    def problems(self, answer: Any, context: dict | None = None) -> list[str]:
        found = validate(answer, self.schema)
        if not found and self.check is not None:
            found = self.check(answer, context or {})
        return found


def _obj(props: dict, **extra: Any) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False,
            **extra}


_STR = {"type": "string"}
_NSTR = {"type": ["string", "null"]}
_NNUM = {"type": ["number", "null"]}


# -- validation of the JSON-schema subset we use ----------------------------------------------------
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value: Any, t: str) -> bool:
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, _TYPES[t])


def validate(value: Any, schema: dict, path: str = "answer") -> list[str]:
    types = schema.get("type")
    if types is not None:
        tlist = [types] if isinstance(types, str) else list(types)
        if not any(_is(value, t) for t in tlist):
            return [f"{path}: expected {' or '.join(tlist)}, got {type(value).__name__} {value!r:.60}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r:.60} is not one of {schema['enum']}"]
    out: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                out.append(f"{path}: missing required field {key!r}")
        if schema.get("additionalProperties") is False:
            for key in value:
                if key not in props:
                    out.append(f"{path}: unexpected field {key!r} (allowed: {', '.join(props)})")
        for key, sub in props.items():
            if key in value:
                out += validate(value[key], sub, f"{path}.{key}")
    elif isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.append(f"{path}: needs at least {schema['minItems']} item(s), got {len(value)}")
        if "items" in schema:
            for i, item in enumerate(value):
                out += validate(item, schema["items"], f"{path}[{i}]")
    elif _is(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{path}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{path}: {value} is above the maximum {schema['maximum']}")
    return out


# -- candidate source checks -----------------------------------------------------------------------
_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_+-]*\s*\n(.*?)\n\s*```\s*$", re.S)


def normalize_source(source: str) -> str:
    """Models often wrap a file in a Markdown fence even when asked not to: unwrap it rather than
    spend a retry on it."""
    m = _FENCE.match(source)
    return (m.group(1) if m else source).strip("\n") + "\n"


def _literal(node: ast.AST, name: str) -> tuple[Any, str | None]:
    try:
        return ast.literal_eval(node), None
    except ValueError:
        return None, f"`{name}` must be a literal dict (numbers, strings, lists, tuples), not computed"


def check_source(source: str) -> list[str]:
    """What the candidate contract (README.md "A problem, a candidate") lets us check without running the file."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [f"the source does not parse: line {e.lineno}: {e.msg}"]
    problems: list[str] = []
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if "ModelNew" not in classes:
        problems.append("the source defines no module-level `class ModelNew(torch.nn.Module)`; a candidate "
                        "file must define it (same constructor arguments as Model)")
    else:
        methods = {n.name for n in classes["ModelNew"].body if isinstance(n, ast.FunctionDef)}
        if "forward" not in methods:
            problems.append("`ModelNew` defines no `forward` method")
    if re.search(r"\bModel\.forward\b|super\(\)\.forward\(", source):
        problems.append("the source calls the reference `Model.forward`, which the integrity check rejects; "
                        "compute the output with your own kernels")
    values: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("CONFIG", "SPACE"):
                value, err = _literal(node.value, name)
                if err:
                    problems.append(err)
                elif not isinstance(value, dict):
                    problems.append(f"`{name}` must be a dict")
                else:
                    values[name] = value
    space, config = values.get("SPACE"), values.get("CONFIG")
    if space is not None:
        if config is None:
            problems.append("`SPACE` is defined without `CONFIG`: every tunable needs a default in CONFIG")
        else:
            missing = [k for k in space if k not in config]
            if missing:
                problems.append(f"`SPACE` names {missing} which `CONFIG` lacks")
        for k, v in space.items():
            ok = (isinstance(v, list) and len(v) > 0) or (
                isinstance(v, tuple) and len(v) in (2, 3) and all(isinstance(x, int) for x in v[:2])
                and (len(v) == 2 or v[2] == "log"))
            if not ok:
                problems.append(f"`SPACE[{k!r}]` must be a non-empty list of choices, (low, high) ints, "
                                "or (low, high, 'log')")
    return problems


# -- the four roles ---------------------------------------------------------------------------------
def _check_plan(answer: dict, ctx: dict) -> list[str]:
    refs: list[str] = ctx.get("parent_refs", [])
    out = []
    for i, p in enumerate(answer["proposals"]):
        ref = p["parent"]
        if not refs and ref is not None:
            out.append(f"proposals[{i}].parent: the tree is empty, so parent must be null (a seed)")
        elif refs and ref not in refs:
            out.append(f"proposals[{i}].parent: {ref!r} is not one of the nodes selected for expansion "
                       f"({', '.join(refs)})")
        if not p["idea"].strip():
            out.append(f"proposals[{i}].idea is empty")
    return out


def _check_code(answer: dict, ctx: dict) -> list[str]:
    return check_source(normalize_source(answer["source"]))


def _check_debug(answer: dict, ctx: dict) -> list[str]:
    if answer["source"] is None:
        return []
    return check_source(normalize_source(answer["source"]))


_LANG = {"type": "string", "enum": ["triton", "cuda", "torch"]}

SCHEMAS: dict[str, RoleSchema] = {
    "planner": RoleSchema(
        "planner", "submit_plan", "Submit the proposed expansions of the search tree.",
        _obj({"proposals": {"type": "array", "minItems": 1, "items": _obj({
            "parent": {**_NSTR, "description": "ref of the node to expand (null only for a seed)"},
            "idea": {**_STR, "description": "the change to make, concrete enough for the coder"},
            "rationale": {**_STR, "description": "why it should help, from the profile and the tree"},
            "expected_gain": {**_NNUM, "description": "expected speedup over the parent, e.g. 1.3"},
        })}}),
        _check_plan),
    "coder": RoleSchema(
        "coder", "submit_candidate", "Submit one complete candidate file.",
        _obj({"source": {**_STR, "description": "the complete Python file, no Markdown fences"},
              "action": {**_STR, "description": "one short line: the change from the parent"},
              "language": _LANG}),
        _check_code),
    "debugger": RoleSchema(
        "debugger", "submit_fix", "Submit the diagnosis and the fixed file (or null to give up).",
        _obj({"diagnosis": {**_STR, "description": "what went wrong and why"},
              "source": {**_NSTR, "description": "the complete fixed file, or null to give up"},
              "action": {**_STR, "description": "one short line: what the fix changes"}}),
        _check_debug),
    "analyst": RoleSchema(
        "analyst", "submit_analysis", "Submit the performance analysis of the candidate.",
        _obj({"bound": {"type": "string", "enum": ["memory", "compute", "latency", "unknown"]},
              "pct_of_ceiling": {**_NNUM, "minimum": 0, "maximum": 150,
                                 "description": "achieved % of the binding roofline ceiling"},
              "evidence": {**_STR, "description": "the numbers that support the verdict"},
              "next_ideas": {"type": "array", "items": _STR}})),
}
