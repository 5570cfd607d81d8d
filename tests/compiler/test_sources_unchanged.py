"""The compiler generates byte for byte what it generated when ``sources_sha256.json`` was written (issue 33: the
compiler's move, the lowering registry and the template text must not change a generated source). See
``source_hashes.py`` for what is hashed and how to regenerate the fixture when a change is meant."""

from __future__ import annotations

import json

import pytest
from source_hashes import FIXTURE, KB, all_hashes, problem_files, spec_of, template_hashes

WANT = json.loads(FIXTURE.read_text())


def _differ(got: dict[str, str], want: dict[str, str]) -> list[str]:
    return sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))


@pytest.mark.parametrize("family", ["gemm", "conv"])
def test_template_sources_unchanged(family):
    got = template_hashes()[family]
    bad = _differ(got, WANT[f"template/{family}"])
    assert not bad, f"{len(bad)} of {len(got)} {family} specs generate other text, first: {[spec_of(family, k) for k in bad[:2]]}"


@pytest.mark.slow
@pytest.mark.skipif(not (KB / "level1").is_dir(), reason=f"no KernelBench at {KB}")
def test_kernelbench_sources_unchanged():
    """Every seed and one-action child of the KernelBench level1/level2 problems (about 45 s on 2 cores)."""
    got = all_hashes(problem_files())
    want = {k: v for k, v in WANT.items() if not k.startswith("template/")}
    assert set(got) == set(want)
    bad = {p: _differ(got[p], want[p]) for p in got if got[p] != want[p]}
    assert not bad, f"{len(bad)} problems generate other sources: {dict(list(bad.items())[:3])}"
