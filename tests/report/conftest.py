from __future__ import annotations

from pathlib import Path

import pytest

from kernellab.store import Store


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "k.db")
    yield s
    s.close()
