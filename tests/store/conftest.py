"""What the store's test files share: a store of each backend (in memory and in a file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernellab.store import Store


@pytest.fixture(params=["memory", "file"])
def store(request, tmp_path: Path):
    s = Store(":memory:" if request.param == "memory" else tmp_path / "k.db")
    yield s
    s.close()
