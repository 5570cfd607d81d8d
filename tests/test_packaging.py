"""The wheel carries the agents' prompts and skills, and building it prints no setuptools warning
about them (every install used to print two "absent from the `packages` configuration" blocks)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_has_prompts_and_skills_without_warnings(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "absent from the `packages` configuration" not in out
    (wheel,) = tmp_path.glob("kernellab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for folder in ("prompts", "skills"):
        expected = sorted(p.name for p in (ROOT / "kernellab" / "agents" / folder).glob("*.md"))
        assert expected and sorted(Path(n).name for n in names if f"kernellab/agents/{folder}/" in n
                                   and n.endswith(".md")) == expected


def test_every_folder_of_the_tree_is_a_listed_package() -> None:
    """pyproject lists the packages by hand (prompts/ and skills/ hold only data): a folder added under
    kernellab/ and not listed there would be missing from the wheel, and from the GPU host's install."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(d.relative_to(ROOT).parts) for d in [ROOT / "kernellab", *(ROOT / "kernellab").rglob("*")]
               if d.is_dir() and d.name != "__pycache__" and any(f.suffix in (".py", ".md") for f in d.iterdir())}
    assert listed == folders
