"""What a sandboxed process may see and read: the allow-listed environment and the read-only
roots (bound by bubblewrap, allowed by Landlock). Trusted: computed by the parent and the zygote."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path
from typing import Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

# Anything not named here (DATABASE_URL, DYNO_SECRET_KEY, DYNO_RUNNER_TOKEN, AWS_*, *_API_KEY, CELERY_BROKER_URL,
# signing key paths, ...) never reaches candidate code.
ENV_PASSTHROUGH: tuple[str, ...] = (
    "PATH",
    "LANG",
    "LC_ALL",
    "TZ",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
    "TRITON_INTERPRET",
    "TRITON_PTXAS_PATH",
    "TRITON_LIBCUDA_PATH",
)

# glibc serves a large block from a fresh mapping (a page fault per 4 KiB on first touch) until a
# freed mapping teaches it to use the heap instead, and trims the heap back to the OS when its top
# is free. Both depend on the process's history, so two identical workers ran the same softmax
# at 0 and at 900 page faults per call, 1.3 ms against 2.5 ms, for a whole audit. Fixed
# thresholds (which also switch the adaptation off) give every worker the same allocator: blocks
# up to 32 MiB (glibc's ceiling) come from a heap that is never trimmed, so after the warm-up a
# sample measures the kernel, not the kernel's page faults.
MALLOC_ENVIRONMENT = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
}


def sandbox_environment(source: dict[str, str], *, home: str, threads: int) -> dict[str, str]:
    """The complete environment a sandboxed process gets: allow-listed names plus fixed values."""
    env = {name: source[name] for name in ENV_PASSTHROUGH if name in source}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(home_environment(home))
    env.update(
        PYTHONPATH=str(REPO_ROOT),
        PYTHONNOUSERSITE="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        # Inductor's default compile pool forks helper processes that outlive the call; in-process
        # compilation keeps the stray-process check meaningful.
        TORCHINDUCTOR_COMPILE_THREADS="1",
        **MALLOC_ENVIRONMENT,
    )
    return env


def home_environment(home: str) -> dict[str, str]:
    return {
        "HOME": home,
        "TMPDIR": os.path.join(home, "tmp"),
        "XDG_CACHE_HOME": os.path.join(home, "cache"),
        "TRITON_CACHE_DIR": os.path.join(home, "triton"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(home, "inductor"),
    }


# The few files of /etc a worker needs: the dynamic loader's cache, user and group names (getpwuid),
# name service configuration, the time zone, and the `cc` alternative a compiler call resolves.
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/alternatives",
)


def read_roots(*, device: str, extra: Sequence[str] = ()) -> list[str]:
    """Everything a worker may read (besides /proc, /dev and its own scratch directory): the
    interpreter and the venv, system libraries and compilers, the few /etc files above, the CPU
    topology torch reads, of this repository only the packages candidates may import, and the
    caller's extra roots. bubblewrap binds exactly these; Landlock allows exactly these."""
    roots = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        "/usr",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/bin",
        "/sbin",
        *ETC_FILES,
        "/sys/devices/system/cpu",
        "/sys/devices/system/node",
        str(REPO_ROOT / "runners"),
        str(REPO_ROOT / "optimizer"),
        *(os.path.realpath(p) for p in extra),
    }
    if device.startswith("cuda"):
        # The driver and NVML walk the PCI tree and read the module's parameters.
        roots.update({"/sys/devices", "/sys/bus", "/sys/module/nvidia"})
    return sorted(p for p in roots if os.path.lexists(p))


def gpu_device_nodes(device: str) -> list[str]:
    return sorted(glob.glob("/dev/nvidia*")) if device.startswith("cuda") else []


# Device files a worker may write besides the GPU's: writes to /dev/null are how subprocess and
# logging discard output. Nothing else of /dev (no /dev/shm: files there would outlive a worker).
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
