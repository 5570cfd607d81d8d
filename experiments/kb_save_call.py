"""Keep what one device call of the public-suite run brought back, under the names the progress page uses.

    python experiments/kb_save_call.py FILES_AT LABEL [--results experiments/results] [--dry-run]

FILES_AT is the folder the device tool put the call's files in (``files_at``); the call ran
``scripts/kb_public.sh`` with ``OUT=$OUT/kb`` (a bench call) and/or ``OUT=$OUT/xc`` (a cross-check call).
LABEL names the call in the pages' names, e.g. ``s34-call1``. From ``kb/``: the bench's page
(``*-kb-public.md/.json``) and log become ``<date>-<device>-kb-public-<LABEL>.md/.json/.log`` and the database
``kb-public.db.gz`` replaces ``kb-public-level12-budget4.db.gz``; from ``xc/``: the cross-check's page becomes
``<date>-<device>-kb-crosscheck-<LABEL>.md/.json``. Every file is written read-write for all (the device tool's
copies are read-only) and the progress page's row is printed: commit, problems finished, wall and bench seconds,
GPU busy share.

Refused (exit 2, one line, nothing written): a database whose results come from another device than the one it
would replace (one database holds one GPU model's timings: a call that ran on an H100 must not replace the H200
suite's database), a call with neither folder, a page whose JSON cannot be read.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE_DB = "kb-public-level12-budget4.db.gz"


class SaveError(Exception):
    """Bad input: one line, exit 2."""


def db_devices(gz: Path) -> set[str]:
    """The devices the database's campaigns ran on."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "x.db"
        try:
            db.write_bytes(gzip.decompress(gz.read_bytes()))
            with sqlite3.connect(db) as con:
                return {r[0] for r in con.execute("select distinct device from campaigns") if r[0]}
        except (OSError, EOFError, sqlite3.DatabaseError) as exc:
            raise SaveError(f"{gz}: not a gzipped bench database ({exc})") from None


def _page(folder: Path, pattern: str) -> tuple[Path, dict] | None:
    pages = sorted(folder.glob(pattern))
    if not pages:
        return None
    path = pages[-1]
    try:
        return path, json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SaveError(f"{path}: not a readable page ({exc})") from None


def _slug(device: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")[:24]


def plan(files_at: Path, label: str, results: Path) -> tuple[list[tuple[Path, Path]], list[str]]:
    """(source, destination) pairs and the lines to print."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", label):
        raise SaveError(f"label {label!r}: letters, digits, '.', '_' and '-' only (e.g. s34-call1)")
    kb, xc = files_at / "kb", files_at / "xc"
    if not kb.is_dir() and not xc.is_dir():
        raise SaveError(f"{files_at}: neither kb/ (a bench call) nor xc/ (a cross-check call)")
    copies: list[tuple[Path, Path]] = []
    lines: list[str] = []
    if kb.is_dir():
        got = _page(kb, "*-kb-public.json")
        if got is None:
            raise SaveError(f"{kb}: no bench page (*-kb-public.json)")
        path, page = got
        stem = f"{page['date'][:10]}-{_slug(page['device'])}-kb-public-{label}"
        copies += [(path, results / f"{stem}.json"), (path.with_suffix(".md"), results / f"{stem}.md")]
        if (kb / "kb-bench.log").is_file():
            copies.append((kb / "kb-bench.log", results / f"{stem}.log"))
        db = kb / "kb-public.db.gz"
        if db.is_file():
            new, old = db_devices(db), db_devices(results / SUITE_DB) if (results / SUITE_DB).is_file() else set()
            if old and not new <= old:
                raise SaveError(f"{db}: results from {', '.join(sorted(new - old))}, and {results / SUITE_DB} holds "
                                f"{', '.join(sorted(old))}'s: one database holds one device's timings; not replaced")
            copies.append((db, results / SUITE_DB))
        else:
            lines.append(f"kb_save_call: {db} did not come back: the suite's database stays as it was")
        pace = page.get("pace") or {}
        commit = (page.get("versions") or {}).get("commit", "?")
        busy = pace.get("gpu_busy_share")
        lines.append(f"| ? | ? | {commit} | {pace.get('problems_done', '?')} ({page['problems_finished']}/"
                     f"{page['problems_total']}) | ? (bench {pace.get('wall_s', '?')}) | "
                     f"{'-' if busy is None else f'{busy:.2f}'} | `{stem}.md` |")
    if xc.is_dir():
        got = _page(xc, "*-kb-crosscheck.json")
        if got is None:
            raise SaveError(f"{xc}: no cross-check page (*-kb-crosscheck.json)")
        path, page = got
        env = page.get("environment") or {}
        stem = f"{env.get('date', '')[:10]}-{_slug(env.get('device', 'device'))}-kb-crosscheck-{label}"
        copies += [(path, results / f"{stem}.json"), (path.with_suffix(".md"), results / f"{stem}.md")]
        a = page.get("agreement") or {}
        lines.append(f"cross-check: verdicts agree on {a.get('verdicts_agree')} of {a.get('verdicts_compared')}, "
                     f"{a.get('kernelbench_no_verdict')} without a KernelBench verdict; wall {page.get('wall_s')} s; "
                     f"`{stem}.md` (the next call's KB_KEEP: experiments/results/{stem}.json)")
    missing = [str(src) for src, _ in copies if not src.is_file()]
    if missing:
        raise SaveError(f"missing: {', '.join(missing)}")
    return copies, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files_at", help="the folder the device tool put the call's files in")
    ap.add_argument("label", help="the call's name in the pages' names, e.g. s34-call1")
    ap.add_argument("--results", default=str(ROOT / "experiments" / "results"), help="[experiments/results]")
    ap.add_argument("--dry-run", action="store_true", help="say what would be copied, copy nothing")
    args = ap.parse_args(argv)
    try:
        copies, lines = plan(Path(args.files_at), args.label, Path(args.results))
    except SaveError as exc:
        print(f"kb_save_call: error: {exc}", file=sys.stderr)
        return 2
    for src, dst in copies:
        print(f"{src} -> {dst}")
        if not args.dry_run:
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(dst.name + ".tmp")
            shutil.copyfile(src, tmp)  # contents only: the copy is the writer's, not read-only
            tmp.chmod(0o644)
            tmp.replace(dst)  # a database replaced whole or not at all
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
