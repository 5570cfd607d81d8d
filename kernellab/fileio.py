"""Atomic writes of result and report files: a reader (or a killed run) never sees half a file."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, data: str | bytes, encoding: str = "utf-8") -> Path:
    """Write ``data`` to ``path`` through a temp file in the same folder and ``os.replace`` (atomic on
    POSIX and Windows within one file system, which a temp file elsewhere would not guarantee).
    Creates the parent folder. Returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode(encoding) if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file 0600: a replaced file keeps its mode, a new one gets what a plain
        # open() would have given it
        if out.exists():
            os.chmod(tmp, stat.S_IMODE(out.stat().st_mode))
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return out


def write_result_pages(out_dir: str | os.PathLike, slug: str, date: str, device: str, markdown: str,
                       data: dict) -> Path:
    """A side-by-side benchmark's result pages, ``<out_dir>/<date>-<device>-<slug>.md`` and ``.json`` (the date's day,
    the device's name as a lowercase slug), each written atomically. Returns the path without its suffix."""
    import json
    import re

    tag = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    stem = Path(out_dir) / f"{date[:10]}-{tag}-{slug}"
    write_atomic(stem.with_suffix(".md"), markdown)
    write_atomic(stem.with_suffix(".json"), json.dumps(data, indent=2) + "\n")
    return stem
