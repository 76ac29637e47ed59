"""What a freshly forked worker does to itself before it sees any candidate code: resource
limits, the drop to an unprivileged uid, Landlock, seccomp. Runs in the worker (about to be untrusted)."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import stat
from typing import Any, Sequence

from runners.sandbox import seccomp
from runners.sandbox.environment import REPO_ROOT, WRITABLE_DEVICES, gpu_device_nodes, read_roots

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
_SYS_LANDLOCK_CREATE_RULESET = 444  # same number on every architecture
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}.get(platform.machine())


def prctl(option: int, value: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def _drop_bounding_set() -> None:
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            if ctypes.get_errno() == errno.EINVAL:
                break  # past the last capability
            raise OSError(ctypes.get_errno(), "dropping the capability bounding set failed")


def drop_capabilities() -> None:
    """Leave the current uid without any capability, so it cannot override permissions or regain them."""
    _drop_bounding_set()
    if _SYS_CAPSET is None:
        raise OSError(errno.ENOSYS, f"capset syscall number unknown on {platform.machine()}")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable for both 32-bit halves: all zero
    if _libc.syscall(_SYS_CAPSET, header, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset failed: {os.strerror(err)}")


def become(uid: int, gid: int, groups: Sequence[int] = ()) -> None:
    """Drop to `uid`/`gid` for good: no supplementary groups but `groups` (those that own the GPU's
    device files, where only their group may open them), no bounding set, and (the kernel's rule
    for a change away from uid 0) no permitted, effective or ambient capabilities."""
    _drop_bounding_set()
    os.setgroups(sorted(set(groups)))
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise OSError(errno.EPERM, "the uid drop did not take")


def device_groups(nodes: Sequence[str]) -> list[int]:
    """The groups a worker must keep to open `nodes`: the owning group of each node that its
    group may read and write but others may not (a driver installed with a device-file group)."""
    groups = set()
    for node in nodes:
        try:
            info = os.stat(node)
        except OSError:
            continue
        if not stat.S_ISCHR(info.st_mode) or info.st_mode & 0o006 == 0o006:
            continue
        if info.st_mode & 0o060 == 0o060:
            groups.add(info.st_gid)
    return sorted(groups)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when unavailable."""
    version = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_TRUNCATE = 1 << 14
_FS_READ = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
_FILE_ACCESS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE


def apply_landlock(*, abi: int, writable: Sequence[str], readable: Sequence[str], listable: Sequence[str],
                   handle_fs: bool = True, handle_net: bool = True, scope: bool = True) -> None:
    """Restrict this process: write only under `writable`, read only under `readable`, list
    `listable`; no TCP bind/connect (ABI >= 4); no signals or abstract sockets outside (ABI >= 6).

    Landlock also confines ptrace and /proc/<pid>/environ|mem to processes in the same domain.
    """
    fs_bits = {1: 13, 2: 14}.get(abi, 15)  # REFER arrives in ABI 2, TRUNCATE in ABI 3
    handled_fs = (1 << fs_bits) - 1 if handle_fs else 0
    attr = _RulesetAttr(
        handled_access_fs=handled_fs,
        handled_access_net=0b11 if abi >= 4 and handle_net else 0,
        scoped=0b11 if abi >= 6 and scope else 0,
    )
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for paths, access in ((writable, handled_fs), (readable, _FS_READ), (listable, _FS_READ_DIR)) if handled_fs else ():
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # a root that does not exist on this machine
                try:
                    allowed = access if stat.S_ISDIR(os.fstat(fd).st_mode) else access & _FILE_ACCESS
                    rule = _PathBeneathAttr(allowed_access=allowed & handled_fs, parent_fd=fd)
                    if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
                finally:
                    os.close(fd)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


def own_proc_for(device: str) -> list[str]:
    """The CUDA driver writes under the process's own /proc/<pid> while it starts (without it
    cuInit fails with error 304, "OS call failed"; seen on an H200 host, benchmarks/
    gpu_lockdown_probe.py). "/proc/self" resolves, when the rule is made, to this worker's own
    directory only: another process's /proc entries stay read-only to it."""
    return ["/proc/self"] if device.startswith("cuda") else []


def worker_plan(plan: dict[str, Any], role: str) -> dict[str, Any]:
    """The sandbox plan as one worker applies it: a candidate takes the candidate uid where the
    plan has one, so it shares no uid with the trusted workers it is measured against."""
    if role == "candidate" and plan.get("uid") is not None and plan.get("candidate_uid") is not None:
        return {**plan, "uid": int(plan["candidate_uid"]), "gid": int(plan["candidate_gid"])}
    return plan


def lock_down(config: dict[str, Any], scratch: str) -> None:
    """Everything between the fork and the first request, in an order where each step still has
    the rights it needs: limits, then the uid drop, then Landlock, then seccomp (which refuses
    the mount and ptrace calls nothing after it may need)."""
    plan = config["plan"]
    # No RLIMIT_CPU: it arms a process CPU timer, and while one runs the kernel reports the
    # process's CPU clock only at tick granularity, which blinds the parent's CPU accounting.
    # The parent's watchdog and the worker's cgroup enforce CPU and memory instead.
    limits = [
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, int(config["file_bytes"])),
        (resource.RLIMIT_NOFILE, int(config["open_files"])),
    ]
    if not str(config["device"]).startswith("cuda"):
        # CUDA reserves far more address space than it uses, so on GPUs the memory cgroup and
        # the parent's resident-set watchdog are the memory limit instead.
        limits.append((resource.RLIMIT_AS, int(config["memory_bytes"])))
    if plan.get("uid") is not None:
        # Counts every process and thread of the sandbox user; only meaningful for a dedicated uid.
        limits.append((resource.RLIMIT_NPROC, 4096))
    for which, value in limits:
        resource.setrlimit(which, (value, value))
    if plan.get("uid") is not None:
        become(int(plan["uid"]), int(plan["gid"]), device_groups(gpu_device_nodes(str(config["device"]))))
    elif plan.get("drop_capabilities"):
        drop_capabilities()
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    abi = int(plan.get("landlock_abi") or 0)
    if abi:
        device = str(config["device"])
        apply_landlock(
            abi=abi,
            writable=[scratch, *WRITABLE_DEVICES, *gpu_device_nodes(device), *own_proc_for(device)],
            readable=[*read_roots(device=device, extra=config.get("extra_read_roots", [])), "/proc", config["shared_dir"]],
            listable=[str(REPO_ROOT)],
        )
    if plan.get("seccomp"):
        seccomp.install()
