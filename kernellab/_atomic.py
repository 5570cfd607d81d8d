"""Result files written atomically: a temp file in the same folder, then ``os.replace``."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a part;
    a crash midway leaves no partial file under the name (only a stray ``.tmp`` beside it at worst)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file 0600: keep the replaced file's mode, else the usual one
        os.chmod(tmp, stat.S_IMODE(out.stat().st_mode) if out.exists() else 0o644)
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return out
