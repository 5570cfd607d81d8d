"""A candidate's source as a module of the worker's process, and its removal after the job.

Below both the job (``_job``, which loads the candidate and cleans up after it) and the processes that run it
(``_worker``, ``_profile_target``): the one piece they share, so that neither imports the other for it."""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any


def load_module(source: str, directory: Path, name: str) -> Any:
    """Execute ``source`` from a real file (Triton reads kernel source through ``inspect``)."""
    path = directory / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def cleanup(directory: Path, home: Path, names: list[str]) -> None:
    for n in names:
        sys.modules.pop(n, None)
    os.chdir(home)
    shutil.rmtree(directory, ignore_errors=True)
    gc.collect()
