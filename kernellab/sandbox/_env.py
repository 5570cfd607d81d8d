"""The environment a sandbox worker starts with: an allow-list, minus anything that looks secret.

Workers are started with ``subprocess`` and an explicit environment (not by editing our own
``os.environ``, which other threads of the caller may be reading), so even ``/proc/self/environ``
of a worker holds no credentials. The process that starts workers is made non-dumpable
(:func:`protect_parent`), so a candidate cannot read credentials out of *our* ``/proc/<pid>/environ``
or memory either.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from pathlib import Path

# Variables a worker legitimately needs: paths, locale, toolchains, GPU selection, library knobs.
_ALLOW = re.compile(
    r"^(PATH|LANG|LANGUAGE|LC_[A-Z]+|TZ|USER|LOGNAME|SHELL|TERM|PYTHONPATH|PYTHONHASHSEED|VIRTUAL_ENV|"
    r"CONDA_PREFIX|LD_LIBRARY_PATH|LIBRARY_PATH|CPATH|CC|CXX|CUDA_[A-Z_]+|CUDA_HOME|CUDA_PATH|NVIDIA_[A-Z_]+|"
    r"NVCC_[A-Z_]+|TRITON_[A-Z_]+|TORCH_[A-Z_]+|TORCHINDUCTOR_[A-Z_]+|PYTORCH_[A-Z_]+|CUPY_[A-Z_]+|"
    r"OMP_NUM_THREADS|MKL_[A-Z_]+|OPENBLAS_[A-Z_]+|KMP_[A-Z_]+|NUMEXPR_[A-Z_]+|KERNELLAB_[A-Z_]+|"
    # torch's CPU allocator on transparent huge pages: on by default (worker_env), "0" where set turns it off
    r"THP_MEM_ALLOC_ENABLE)$")
# Never passed on, even when the allow-list matches (e.g. a hypothetical TRITON_TOKEN).
_DENY = re.compile(
    r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|ACCESS_?KEY|SESSION_?KEY|AUTH|COOKIE|"
    r"^AWS_|^GOOGLE_|^GCP_|^GCLOUD_|^AZURE_|^OPENAI_|^ANTHROPIC_|^HF_|^HUGGING|^GITHUB_|^GH_|^GITLAB_|"
    r"^SSH_|^KUBE|^DOCKER_|^NPM_|^PYPI_|^TWINE_|^WANDB_|^DATABRICKS_|^SLACK_)", re.I)


def is_secret(name: str) -> bool:
    return bool(_DENY.search(name))


def worker_env(home: str, device_env: dict[str, str]) -> dict[str, str]:
    """The environment of one worker. ``home`` is its private temporary directory (also ``HOME``
    and ``TMPDIR``, so that tools reading ``~/.aws`` or ``~/.netrc`` find nothing); compiled-kernel
    caches keep pointing at the user's real caches so a recompiled worker reuses binaries."""
    real_home = Path.home()
    env = {k: v for k, v in os.environ.items() if _ALLOW.match(k) and not is_secret(k)}
    env.setdefault("TRITON_CACHE_DIR", str(real_home / ".triton" / "cache"))
    env.setdefault("CUPY_CACHE_DIR", str(real_home / ".cupy" / "kernel_cache"))
    # The reference outputs' copies to fresh host pages are most of a large job's reference; huge pages cut
    # their page faults: 2.56x on a 7.5 GB copy (experiments/results/2026-12-05-nvidia-h100-host-copies-thp-s31.md).
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(os.environ.get("TMPDIR", "/tmp"))
                                                  / f"torchinductor_{os.environ.get('USER', 'kernellab')}"))
    # The worker imports kernellab the way we did: our sys.path first.
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["HOME"] = home
    env["TMPDIR"] = home
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(device_env)
    return env


_PR_SET_DUMPABLE = 4


def _environ_names() -> set[str]:
    """Names in ``os.environ`` and in the environment the process started with."""
    names = set(os.environ)
    try:
        with open("/proc/self/environ", "rb") as f:
            names |= {kv.split(b"=", 1)[0].decode("utf-8", "replace") for kv in f.read().split(b"\0") if kv}
    except OSError:
        pass
    return names


_protected = False


def protect_parent() -> bool:
    """Make this process non-dumpable (Linux ``prctl(PR_SET_DUMPABLE, 0)``) when its environment
    holds anything secret. A worker runs as the same user, and ``/proc/<pid>/environ`` keeps the
    environment a process *started* with (removing a key from ``os.environ`` does not erase it), so
    a candidate could read the caller's API keys through ``os.getppid()``; the kernel refuses
    ``environ``, ``mem`` and ``process_vm_readv`` of a non-dumpable process to other processes
    unless they hold ``CAP_SYS_PTRACE`` (or, for reading, ``CAP_PERFMON``/``CAP_SYS_ADMIN``). The
    cost: no core dump of this process, and attaching a debugger or py-spy needs root. A worker
    drops those capabilities (:func:`drop_inspect_caps`), which matters when it runs as root.
    Processes outside kernellab (the user's shell, say) are beyond its reach. Returns whether the
    process is protected."""
    global _protected
    if _protected:
        return True
    if not sys.platform.startswith("linux") or not any(is_secret(k) for k in _environ_names()):
        return False
    try:
        _protected = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - not glibc/musl
        _protected = False
    return _protected


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAP_V3, _PR_CAPBSET_DROP = 0x20080522, 24
# Each of these alone lets root read a non-dumpable process's environ (measured on Linux 6.18:
# CAP_SYS_PTRACE, and CAP_PERFMON or CAP_SYS_ADMIN through perfmon_capable() for read access).
_CAP_SYS_PTRACE, _CAP_SYS_ADMIN, _CAP_PERFMON = 19, 21, 38
_INSPECT_CAPS = (_CAP_SYS_PTRACE, _CAP_SYS_ADMIN, _CAP_PERFMON)


def drop_inspect_caps() -> bool:
    """Drop the capabilities that let a process read another's memory and environment from this
    process and anything it executes (a worker calls this before it loads a candidate). With them
    a root worker passes the kernel's check on a non-dumpable parent; without them it is checked
    like an ordinary user, who never holds them (which is also why GPU work does not need them).
    Returns whether none of them is left."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # the bounding set first: a program the candidate executes as root would get them back from there
        for cap in _INSPECT_CAPS:
            libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
        hdr, data = _CapHeader(_CAP_V3, 0), (_CapData * 2)()
        if libc.capget(ctypes.byref(hdr), data) != 0:
            return False
        for cap in _INSPECT_CAPS:
            keep = ~(1 << (cap % 32)) & 0xFFFFFFFF
            for field in ("effective", "permitted", "inheritable"):
                setattr(data[cap // 32], field, getattr(data[cap // 32], field) & keep)
        return libc.capset(ctypes.byref(hdr), data) == 0
    except (OSError, AttributeError):  # pragma: no cover - no capget/capset in this libc
        return False
