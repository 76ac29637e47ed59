"""The bubblewrap command line the zygote starts under: fresh namespaces, read-only binds of
exactly what a worker reads, private /tmp, /dev and /proc. Trusted: built by the parent."""

from __future__ import annotations

import os
import shutil
from typing import Sequence

from runners.sandbox.environment import gpu_device_nodes, read_roots

# Capabilities the zygote keeps (root inside the namespaces, no user namespace): enough to hand
# each worker its scratch directory and then drop it to the sandbox uid. Workers keep none.
ZYGOTE_CAPABILITIES = ("CAP_CHOWN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")


MASKED_PROC_FILES = ("/proc/interrupts", "/proc/softirqs", "/proc/stat", "/proc/schedstat")

def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _bind(path: str, flag: str) -> list[str]:
    """A read-only bind that keeps a symlink a symlink (/lib -> usr/lib), so paths resolve alike."""
    if os.path.islink(path):
        return ["--symlink", os.readlink(path), path]
    return [flag, path, path]


def _parents(paths: Sequence[str], *, premounted: Sequence[str]) -> list[str]:
    """The directories above `paths` that no bind or mount of its own provides, parents first."""
    found: set[str] = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in ("/", ""):
            # A bind provides its whole subtree; a private mount (/tmp) only its own directory.
            bound = any(parent == c or parent.startswith(c.rstrip("/") + "/") for c in paths)
            if not bound and parent not in premounted:
                found.add(parent)
            parent = os.path.dirname(parent)
    return sorted(found, key=lambda p: (p.count("/"), p))


def bwrap_argv(
    *,
    bwrap: str,
    device: str,
    extra_read_roots: Sequence[str],
    root: str,
    shared_dir: str,
    as_root: bool,
) -> list[str]:
    """argv prefix that runs a command inside the sandbox. `root` (scratch, logs) is bound
    read-write and `shared_dir` read-only at their own paths, so the parent reads and writes
    them by path. As root, no user namespace: the zygote drops each worker to uid 65534 itself,
    which keeps the kernel uid unprivileged; otherwise a user namespace gives the namespaces."""
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if as_root:
        argv += ["--cap-drop", "ALL"]
        for cap in ZYGOTE_CAPABILITIES:
            argv += ["--cap-add", cap]
    else:
        argv += ["--unshare-user"]
    argv += ["--die-with-parent", "--new-session", "--hostname", "dyno-sandbox"]
    # The private mounts first: a read root may lie below /tmp (a model folder in a temp dir).
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    roots = read_roots(device=device, extra=extra_read_roots)
    for directory in _parents([*roots, root, shared_dir], premounted=["/proc", "/dev", "/tmp"]):
        # bubblewrap would copy the host's mode (700 for /root) onto the directories it creates
        # for a bind; the sandbox user must be able to walk down to /root/.pyenv/versions/X.
        argv += ["--perms", "0755", "--dir", directory]
    for path in roots:
        argv += _bind(path, "--ro-bind")
    for node in gpu_device_nodes(device):
        argv += ["--dev-bind", node, node]
    for path in MASKED_PROC_FILES:
        # Per-core counters of the whole machine: the parent's core moves leave one rescheduling
        # interrupt per call on the measurement core, so counts read between two of a worker's
        # samples told it how many calls the other arms had run, and where it stood in the
        # round's secret order (a red team, 2026-12-05). Empty here.
        if os.path.exists(path):
            argv += ["--ro-bind", "/dev/null", path]
    argv += ["--bind", root, root, "--ro-bind", shared_dir, shared_dir, "--chdir", root, "--"]
    return argv
