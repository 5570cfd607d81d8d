"""The environment a sandbox worker starts with: an allow-list, minus anything that looks secret.

Workers are started with ``subprocess`` and an explicit environment (not by editing our own
``os.environ``, which other threads of the caller may be reading), so even ``/proc/self/environ``
of a worker holds no credentials.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

# Variables a worker legitimately needs: paths, locale, toolchains, GPU selection, library knobs.
_ALLOW = re.compile(
    r"^(PATH|LANG|LANGUAGE|LC_[A-Z]+|TZ|USER|LOGNAME|SHELL|TERM|PYTHONPATH|PYTHONHASHSEED|VIRTUAL_ENV|"
    r"CONDA_PREFIX|LD_LIBRARY_PATH|LIBRARY_PATH|CPATH|CC|CXX|CUDA_[A-Z_]+|CUDA_HOME|CUDA_PATH|NVIDIA_[A-Z_]+|"
    r"NVCC_[A-Z_]+|TRITON_[A-Z_]+|TORCH_[A-Z_]+|TORCHINDUCTOR_[A-Z_]+|PYTORCH_[A-Z_]+|CUPY_[A-Z_]+|"
    r"OMP_NUM_THREADS|MKL_[A-Z_]+|OPENBLAS_[A-Z_]+|KMP_[A-Z_]+|NUMEXPR_[A-Z_]+|KERNELLAB_[A-Z_]+)$")
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
