"""Run a command, and stop it before it takes the host's last memory.

    PYTHONPATH=. python experiments/host_watch.py [--floor-gb G] [--grace-s 12] [--every 0.5] -- CMD [ARG...]

A host out of memory stops answering, and a device call's whole output is lost with it: session 32's H100 call
ended so after 458 s with nothing returned. The watch reads the host's available memory (``MemAvailable``
in ``/proc/meminfo``) every ``--every`` seconds while CMD runs. Under the floor it sends CMD SIGINT (a kernellab
command saves every finished evaluation and stops within 10 s); if CMD is still running ``--grace-s`` later
with the host still under the floor, or the host falls under half the floor meanwhile, CMD and every process
under it get SIGKILL (the sandbox's workers start their own sessions: they are found by their parent links,
not a process group). What the command wrote is kept either way, and the call goes on to return it.

The floor by default is half the sandbox's own (``kernellab.sandbox._reference.host_floor``: a sixteenth of
the host, at least 4 GiB or an eighth): the sandbox fails a job that would go under its floor first, so this
is the last line, for a side whose code has no such floor (a base commit) or memory the sandbox does not
count. ``--floor-gb 0`` never stops anything.

Exit: CMD's status (128 + N where a signal N ended it); a stop for memory is said on stderr in one line
starting ``host_watch: host memory:``. 2 on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GIB = 2**30


def _stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command's name (state, parent, ...), None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, by the parent links in /proc (``[pid]`` without /proc): the sandbox's
    workers start their own sessions, so the bench's process group does not hold them."""
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return [pid]
    children: dict[int, list[int]] = {}
    for name in entries:
        fields = _stat(name)
        if fields is None or len(fields) < 2:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and every descendant; returns the pids signalled. They are stopped first, until a scan
    finds no new one: a stopped process cannot start another, and one orphaned before it is found would be
    out of reach (its parent link then points at init), holding the GPU or the host's memory."""
    seen: list[int] = []
    while True:
        new = [p for p in process_tree(pid) if p not in seen]
        if not new:
            break
        for p in new:
            seen.append(p)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGSTOP)
    for p in seen:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    return seen


def _gone(pid: int) -> bool:
    """Ended (a zombie not yet reaped, or no such process): nothing of it left to stop."""
    fields = _stat(pid)
    if fields is None:
        return os.path.isdir("/proc/self")  # no /proc: never known gone; halt ends the watch
    return fields[0] in ("Z", "X")


def default_floor(total: int) -> int:
    """Half the sandbox's floor for a host of ``total`` bytes."""
    from kernellab.sandbox._reference import host_floor

    return host_floor(total) // 2


class HostWatch(threading.Thread):
    """Watches the host's memory while process ``pid`` runs (see the module's text). ``floor`` bytes, None:
    :func:`default_floor`. ``fired``: why it stopped the process, None while it has not; ``killed``: whether
    it came to SIGKILL; ``least``/``total``: the least available seen and the host's memory, bytes.
    ``halt.set()`` ends the watch."""

    def __init__(self, pid: int, floor: int | None = None, every: float = 0.5, grace_s: float = 12.0,
                 meminfo: str = "/proc/meminfo") -> None:
        super().__init__(daemon=True, name="host-watch")
        self.pid, self.every, self.grace_s, self.meminfo = pid, every, grace_s, meminfo
        self.floor, self.total, self.least = floor, None, None
        self.fired: str | None = None
        self.killed = False
        self.halt = threading.Event()

    def run(self) -> None:
        from kernellab.sandbox._reference import host_memory

        asked = None  # when SIGINT was sent
        while not _gone(self.pid):
            mem = host_memory(self.meminfo)
            if mem is not None:
                avail, self.total = mem
                if self.floor is None:
                    self.floor = default_floor(self.total)
                self.least = avail if self.least is None else min(self.least, avail)
                if avail < self.floor:
                    now = time.monotonic()
                    if asked is None:
                        self.fired = (f"host memory: {avail / GIB:.2f} GiB of {self.total / GIB:.1f} GiB available, "
                                      f"under the {self.floor / GIB:.2f} GiB floor")
                        asked = now
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(self.pid, signal.SIGINT)
                    if avail < self.floor // 2 or now - asked >= self.grace_s:
                        self.fired += (f"; killed with its processes ({avail / GIB:.2f} GiB available"
                                       f" {now - asked:.1f} s after SIGINT)")
                        self.killed = True
                        kill_tree(self.pid)
                        return
            if self.halt.wait(self.every):
                return


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--floor-gb", type=float, default=None, metavar="G",
                    help="Stop CMD when the host has less than G GB (10^9 bytes) available [half the sandbox's floor]")
    ap.add_argument("--grace-s", type=float, default=12.0, help="Seconds from SIGINT to SIGKILL while still under [12]")
    ap.add_argument("--every", type=float, default=0.5, help="Seconds between readings [0.5]")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("host_watch: error: no command (host_watch.py [options] -- CMD [ARG...])", file=sys.stderr)
        return 2
    if (args.floor_gb is not None and args.floor_gb < 0) or args.grace_s < 0 or args.every <= 0:
        print("host_watch: error: --floor-gb and --grace-s must be at least 0, --every above 0", file=sys.stderr)
        return 2
    # a signal to this process reaches CMD too (`timeout -s INT` signals the whole group, a kernellab command
    # ignores a second stop while the first runs its course); this one waits for CMD either way. Set before CMD
    # starts: one that came in between would end this process and leave CMD unwatched.
    child: list[subprocess.Popen] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: [c.send_signal(signum) for c in child])
    try:
        p = subprocess.Popen(cmd)
    except OSError as exc:
        print(f"host_watch: error: {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    child.append(p)
    watch = HostWatch(p.pid, None if args.floor_gb is None else int(args.floor_gb * 1e9), args.every, args.grace_s)
    watch.start()
    rc = p.wait()
    watch.halt.set()
    watch.join(timeout=5)
    if watch.fired:
        print(f"host_watch: {watch.fired}", file=sys.stderr)
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
