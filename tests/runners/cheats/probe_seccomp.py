"""Calls what the seccomp filter refuses: ptrace (PTRACE_TRACEME succeeds for any process the
filter lets through), unshare into a new user namespace, an AF_INET6 socket, and every timer the
kernel would fire on its own while the worker is frozen (a POSIX timer, a timerfd, an interval
timer): their interrupts would land on the shared measurement core in other arms' windows; and
changing its own threads' scheduling (a SCHED_IDLE or niced main thread waits behind its helpers,
which the parent would take off as other processes' time)."""
# probe: seccomp
import ctypes
import json
import signal
import socket

libc = ctypes.CDLL(None, use_errno=True)
outcome = {}
outcome["ptrace"] = "allowed" if libc.ptrace(0, 0, 0, 0) == 0 else ctypes.get_errno()
outcome["unshare"] = "allowed" if libc.unshare(0x10000000) == 0 else ctypes.get_errno()
try:
    socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close()
    outcome["inet6"] = "created"
except OSError as exc:
    outcome["inet6"] = exc.errno
timer_id = ctypes.c_void_p()
outcome["timer_create"] = "allowed" if libc.timer_create(1, None, ctypes.byref(timer_id)) == 0 else ctypes.get_errno()
timer_fd = libc.timerfd_create(1, 0)
outcome["timerfd_create"] = "allowed" if timer_fd >= 0 else ctypes.get_errno()
try:
    signal.setitimer(signal.ITIMER_REAL, 10.0)
    outcome["setitimer"] = "allowed"
except OSError as exc:
    outcome["setitimer"] = exc.errno
import os  # noqa: E402
for name, change in (("sched_setscheduler", lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))),
                     ("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, 0, 10))):
    try:
        change()
        outcome[name] = "allowed"
    except OSError as exc:
        outcome[name] = exc.errno
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
