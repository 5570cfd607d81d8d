"""Rewrite tests/gpu_durations.json (the GPU suite's order, longest first: tests/conftest.py) from the
test-report.txt files of GPU calls (KERNELLAB_TEST_REPORT). A later report's duration replaces an earlier one's;
tests in no report keep their old entry.

    python scripts/gpu_durations.py REPORT [REPORT ...]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "gpu_durations.json"
LINE = re.compile(r"^(PASSED|FAILED|ERROR)\s+([\d.]+)s\s+call\s+(\S+)")


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    known = json.loads(OUT.read_text()) if OUT.exists() else {}
    for p in paths:
        try:
            text = Path(p).read_text()
        except OSError as exc:
            print(f"gpu_durations: cannot read {p}: {exc.strerror}", file=sys.stderr)
            return 2
        for m in filter(None, map(LINE.match, text.splitlines())):
            known[m.group(3).split("@")[0]] = round(float(m.group(2)), 1)
    OUT.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")
    print(f"{len(known)} durations in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
