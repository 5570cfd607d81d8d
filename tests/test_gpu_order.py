"""The GPU suite's order: the longest tests of the last measured run first, so that xdist does not hand a
250 s test out last (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent


def _conftest():
    spec = importlib.util.spec_from_file_location("kernellab_tests_conftest", HERE / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_longest_first_with_unknown_tests_at_the_default():
    conf = _conftest()
    known = json.loads((HERE / "gpu_durations.json").read_text())
    slow, fast = max(known, key=known.get), min(known, key=known.get)
    assert known[slow] > conf._UNKNOWN_S > known[fast]
    items = [SimpleNamespace(nodeid=n) for n in (fast, "tests/x.py::never_measured", slow + "@adversarial")]
    conf._longest_first(items)
    assert [i.nodeid for i in items] == [slow + "@adversarial", "tests/x.py::never_measured", fast]


def test_every_listed_duration_names_a_test_file_that_exists():
    known = json.loads((HERE / "gpu_durations.json").read_text())
    missing = {n.split("::")[0] for n in known if not (HERE.parent / n.split("::")[0]).is_file()}
    assert not missing, missing
