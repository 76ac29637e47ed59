"""Futex wait and wake on a word of a shared file mapping (Linux), for stepped samples.

The parent, holding the worker's only measurement core, announces a call and then sleeps on the
low half of the control page's counter word; the worker wakes it right after writing the call's
done record. The key of a shared futex is the file page, so the parent's mapping and the worker's
read-only one name the same word (a wake needs only read access). Trusted: runs in the parent and
in the worker's harness loop.
"""

from __future__ import annotations

import ctypes
import errno
import platform

_SYSCALL = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_WAIT, _WAKE = 0, 1  # FUTEX_WAIT, FUTEX_WAKE, shared (no FUTEX_PRIVATE_FLAG): parent and worker are two processes

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def available() -> bool:
    return _SYSCALL is not None


def wake(address: int) -> None:
    """Wake one sleeper on the 32-bit word at `address` (none sleeping: a cheap no-op)."""
    if _SYSCALL is not None:
        _syscall(_SYSCALL, ctypes.c_void_p(address), _WAKE, 1, None, None, 0)


def wait(address: int, expected: int, timeout_s: float) -> int:
    """Sleep while the 32-bit word at `address` holds `expected` (its low 32 bits), until a wake,
    a signal or `timeout_s`. Returns at once where the word already differs; the caller checks
    what it waits for again in every case (wake-ups may be spurious). Returns 0, or the error
    number: EAGAIN (the word differed), ETIMEDOUT, EINTR, or one that means no sleep is possible."""
    if _SYSCALL is None:
        return errno.ENOSYS
    seconds = int(timeout_s)
    span = _Timespec(seconds, int((timeout_s - seconds) * 1e9))
    if _syscall(_SYSCALL, ctypes.c_void_p(address), _WAIT, ctypes.c_uint32(expected & 0xFFFFFFFF), ctypes.byref(span), None, 0) == 0:
        return 0
    return ctypes.get_errno()
