"""Calls what the seccomp filter refuses: ptrace (PTRACE_TRACEME succeeds for any process the
filter lets through), unshare into a new user namespace, an AF_INET6 socket."""
# probe: seccomp
import ctypes
import json
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
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
