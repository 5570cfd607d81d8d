"""One run of a campaign at a time: an flock next to the database, and whether a campaign is held or stale."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernellab.campaign.config import CampaignBusy

if TYPE_CHECKING:
    pass


_HELD: set[tuple[str, str]] = set()  # (database, campaign) locked by this process: ":memory:" stores
_HELD_LOCK = threading.Lock()


@contextmanager
def campaign_lock(store: Any, campaign_id: str, name: str | None = None) -> Iterator[None]:
    """Hold the campaign for this run, or raise :class:`CampaignBusy` at once.

    An ``flock`` on ``<database>.<campaign id>.lock``: the kernel releases it when the holder exits or
    is killed (``kill -9`` too), so a crashed run never blocks its resume, and no liveness check is
    needed. The file keeps the holder's pid and host for the message, and is removed when the run
    ends (a killed run leaves it, unlocked, for the next to take). An in-memory store is only
    reachable from this process: a set of held ids does there."""
    label = name or campaign_id
    if getattr(store, "memory", False) or str(getattr(store, "path", ":memory:")) == ":memory:":
        key = (str(id(store)), campaign_id)
        with _HELD_LOCK:
            if key in _HELD:
                raise CampaignBusy(f"campaign {label!r} is already running in this process")
            _HELD.add(key)
        try:
            yield
        finally:
            with _HELD_LOCK:
                _HELD.discard(key)
        return
    import fcntl

    path = _lock_path(store, campaign_id)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            finally:
                os.close(fd)
            raise CampaignBusy(f"campaign {label!r} is already running ({holder}): wait for it to end, "
                               "or stop that process, then resume") from None
        # the holder before us unlinks the file as it lets go: a lock on an unlinked file guards nothing
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        try:
            os.unlink(path)  # still holding it, so no one can have locked this file meanwhile
        except FileNotFoundError:
            pass
        os.close(fd)  # releases the flock


def _lock_path(store: Any, campaign_id: str) -> Path:
    return Path(f"{Path(store.path).resolve()}.{campaign_id}.lock")


def is_held(store: Any, campaign_id: str) -> bool:
    """Whether some process holds :func:`campaign_lock` for the campaign now (runs or re-times it)."""
    if getattr(store, "memory", False) or str(getattr(store, "path", ":memory:")) == ":memory:":
        with _HELD_LOCK:
            return any(cid == campaign_id for _, cid in _HELD)
    import fcntl

    try:
        # no O_CREAT: a missing file is a free lock, and a reader must not leave files behind
        fd = os.open(_lock_path(store, campaign_id), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        # a shared probe, let go at once: a run starting in that instant is refused as busy, never two run
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe
    return False


def is_stale(store: Any, camp: dict) -> bool:
    """A campaign marked ``running`` whose process is gone (``kill -9``, a crash, a lost machine): its
    lock is free. Such a campaign goes on with ``kernellab resume``."""
    return camp.get("status") == "running" and not is_held(store, camp["id"])
