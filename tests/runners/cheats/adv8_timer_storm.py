"""Computes every call as the baseline does, and slows the arms measured after it with interrupts
that nothing of its own runs for: as it replies it arms a kernel timer that fires every 50 us
until its next request disarms it.
A timer stays armed in a frozen process and fires on the core it was armed on, the measurement
core every arm shares: each expiry is an interrupt (on a VM, an exit to the hypervisor) inside the
baseline's or the A/A control's window, which is neither CPU of the candidate's tree nor a
run-queue wait the preemption discount would take off. A red team's storm of POSIX timers read
1.09-1.16x as lower bounds, billable, on `cpu-ci` rmsnorm before the seccomp filter refused them.

This one tries a periodic timerfd and then a periodic POSIX timer (an ignored signal), and raises
if the sandbox refuses both: a silent fallback to honest work would prove nothing. Before the
filter it was accepted at 1.02x [0.97, 1.07] (one periodic timerfd; the red team's thousands of
one-shot timers moved more)."""
# workload: rmsnorm
# verdict: error
# expect: sandbox.import_error
# today: error, both refused (EPERM) by the seccomp filter (2026-12-05)
import ctypes
import signal

import torch.nn.functional as F

import runners.audit.worker as harness

_libc = ctypes.CDLL(None, use_errno=True)
_CLOCK_MONOTONIC = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("interval", _Timespec), ("value", _Timespec)]


class _Sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int), ("pad", ctypes.c_byte * 48)]


def _spec(start_ns: int, every_ns: int) -> _Itimerspec:
    return _Itimerspec(_Timespec(0, every_ns), _Timespec(start_ns // 1_000_000_000, start_ns % 1_000_000_000))


def _arm() -> tuple[str, object]:
    """A periodic timer: a timerfd if the sandbox allows one, else a POSIX timer signalling an
    ignored signal. Raises when both are refused."""
    fd = _libc.timerfd_create(_CLOCK_MONOTONIC, 0)
    if fd >= 0:
        return "timerfd", fd
    refused = [("timerfd_create", ctypes.get_errno())]
    signal.signal(signal.SIGURG, signal.SIG_IGN)
    event = _Sigevent(None, int(signal.SIGURG), 0)  # SIGEV_SIGNAL
    timer = ctypes.c_void_p()
    if _libc.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) == 0:
        return "posix", timer
    refused.append(("timer_create", ctypes.get_errno()))
    raise PermissionError(f"no kernel timer could be armed: {refused}")


_kind, _timer = _arm()
_set = _libc.timerfd_settime if _kind == "timerfd" else _libc.timer_settime
_run = harness.KernelWorker.op_run


def _op_run(self, header):
    # Quiet while its own calls run; storming from just after its reply until its next request.
    _set(_timer, 0, ctypes.byref(_spec(0, 0)), None)
    reply = _run(self, header)
    _set(_timer, 0, ctypes.byref(_spec(200_000, 50_000)), None)
    return reply


harness.KernelWorker.op_run = _op_run


def kernel(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
