"""The seccomp filter every worker installs on itself before candidate code: classic BPF that
refuses kernel interfaces a measured kernel never needs. Untrusted side: runs inside the worker."""

from __future__ import annotations

import ctypes
import errno
import platform

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
# BPF opcodes: ld|w|abs, jmp|jeq|k, jmp|jge|k, jmp|jset|k, ret|k
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
# struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6]. Little-endian: args[0] low word at 16.
_NR, _ARCH, _ARG0 = 0, 4, 16
_AF_UNIX = 1
# Namespace flags of clone(2); clone3 passes flags in memory a filter cannot read, so it answers
# ENOSYS and glibc falls back to clone, whose flags it can.
_CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

_DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "settimeofday",
    "clock_settime", "adjtimex", "clock_adjtime", "acct", "quotactl", "quotactl_fd",
    "name_to_handle_at", "open_by_handle_at",
    # Timers the kernel fires on its own. The parent freezes a worker's tree between its samples,
    # but a POSIX timer, an interval timer or a timerfd stays armed in a frozen process: each
    # expiry is an interrupt on the core it was armed on, the measurement core every arm shares,
    # landing in the windows of the arms measured after it. A measured kernel has no use for them.
    # (So does a thread's sleep with a timeout, which the freezer stops in place with its timer
    # armed: that is judged from the interrupts each arm's window takes, runners.audit.kernel.)
    "timer_create", "timer_settime", "timerfd_create", "timerfd_settime", "setitimer", "alarm",
    # Its own threads' scheduling. A thread made SCHED_IDLE (or niced) waits runnable behind the
    # worker's other threads, and the parent takes the main thread's run-queue wait off a sample
    # as other processes' time: a red team computed every call in a helper thread while its main
    # thread, SCHED_IDLE, yielded (2026-12-05). The floor under that discount (the tree's CPU) is
    # what stopped it, once read exactly; a measured kernel has no use for these either.
    "sched_setscheduler", "sched_setparam", "sched_setattr", "setpriority",
)  # fmt: skip

# (AUDIT_ARCH, syscall numbers) per machine. x86_64 also refuses the x32 ABI (nr >= 0x40000000);
# any other arch value (i386 through int 0x80) kills the process.
_TABLES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "keyctl": 250, "add_key": 248, "request_key": 249, "mount": 165,
        "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "reboot": 169, "swapon": 167,
        "swapoff": 168, "settimeofday": 164, "clock_settime": 227, "adjtimex": 159,
        "clock_adjtime": 305, "acct": 163, "quotactl": 179, "quotactl_fd": 443,
        "name_to_handle_at": 303, "open_by_handle_at": 304,
        "timer_create": 222, "timer_settime": 223, "timerfd_create": 283, "timerfd_settime": 286,
        "setitimer": 38, "alarm": 37,
        "sched_setscheduler": 144, "sched_setparam": 142, "sched_setattr": 314, "setpriority": 141,
        "socket": 41, "socketpair": 53, "clone": 56, "clone3": 435,
    }),
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "keyctl": 219, "add_key": 217, "request_key": 218, "mount": 40,
        "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "reboot": 142, "swapon": 224,
        "swapoff": 225, "settimeofday": 170, "clock_settime": 112, "adjtimex": 171,
        "clock_adjtime": 266, "acct": 89, "quotactl": 60, "quotactl_fd": 443,
        "name_to_handle_at": 264, "open_by_handle_at": 265,
        "timer_create": 107, "timer_settime": 110, "timerfd_create": 85, "timerfd_settime": 86,
        "setitimer": 103,
        "sched_setscheduler": 119, "sched_setparam": 118, "sched_setattr": 274, "setpriority": 140,
        "socket": 198, "socketpair": 199, "clone": 220, "clone3": 435,
    }),
}  # fmt: skip


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def supported() -> bool:
    return platform.machine() in _TABLES


def program(machine: str | None = None) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions. Jumps name labels until resolved below."""
    arch, numbers = _TABLES[machine or platform.machine()]
    deny, enosys, allow, check_socket, check_clone = "deny", "enosys", "allow", "socket", "clone"
    code: list[tuple[int, object, object, int] | str] = [
        (_LD_ABS, 0, 0, _ARCH),
        (_JEQ, 1, 0, arch),
        (_RET, 0, 0, _RET_KILL_PROCESS),
        (_LD_ABS, 0, 0, _NR),
    ]
    if arch == 0xC000003E:
        code.append((_JGE, deny, 0, 0x40000000))
    code += [(_JEQ, deny, 0, numbers[name]) for name in _DENIED if name in numbers]  # aarch64 has no alarm
    code += [
        (_JEQ, enosys, 0, numbers["clone3"]),
        (_JEQ, check_socket, 0, numbers["socket"]),
        (_JEQ, check_socket, 0, numbers["socketpair"]),
        (_JEQ, check_clone, 0, numbers["clone"]),
        (_RET, 0, 0, _RET_ALLOW),
        check_socket, (_LD_ABS, 0, 0, _ARG0), (_JEQ, allow, deny, _AF_UNIX),
        check_clone, (_LD_ABS, 0, 0, _ARG0), (_JSET, deny, allow, _CLONE_NEW),
        deny, (_RET, 0, 0, _RET_ERRNO | errno.EPERM),
        enosys, (_RET, 0, 0, _RET_ERRNO | errno.ENOSYS),
        allow, (_RET, 0, 0, _RET_ALLOW),
    ]
    labels: dict[str, int] = {}
    instructions: list[tuple[int, object, object, int]] = []
    for item in code:
        if isinstance(item, str):
            labels[item] = len(instructions)
        else:
            instructions.append(item)
    resolved = []
    for index, (op, jt, jf, k) in enumerate(instructions):
        jumps = [labels[j] - index - 1 if isinstance(j, str) else j for j in (jt, jf)]
        assert all(0 <= j < 256 for j in jumps), (index, jumps)
        resolved.append((op, jumps[0], jumps[1], k))
    return resolved


def install() -> None:
    """Install the filter on the calling thread (and every thread and process it starts later).
    Needs no_new_privs, which the worker sets first."""
    instructions = program()
    array = (_Filter * len(instructions))(*(_Filter(*item) for item in instructions))
    prog = _Program(len(instructions), array)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"installing the seccomp filter failed: {errno.errorcode.get(err, err)}")
