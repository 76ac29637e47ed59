"""Computes every call as the baseline does, and leaves interrupts behind for the arms measured
after it: 400 threads, started in its very first call (where a runtime's thread pool may start),
sleep with timeouts that expire after its own sample.

The kernel refuses timers to a worker (seccomp), but every sleep with a timeout arms one: the
freezer stops a sleeping thread where it is, with its timeout still armed, and each expiry is an
interrupt on the measurement core (on a VM, an exit to the hypervisor of 10-20 us) inside whichever
arm is being measured then. None of it is CPU of the candidate's tree, nor a run-queue wait the
preemption discount would take off. Each sample's first call re-arms the sleeps to expire one after
another from just after the sample's expected end; a woken thread runs only when the candidate is
thawed for its next sample. Now every freeze is preceded by a stop signal, which wakes each sleeper
out of its sleep (its timer cancelled; the sleep resumes after the thaw, in the candidate's own
time), and the parent counts interrupts per arm besides."""
# workload: rmsnorm
# verdict: no-billable-gain
# expect-any: integrity.interrupts_in_other_arms | integrity.slows_next_arm | timing.clock_mismatch | integrity.background_cpu
# today: accepted at 0.74-0.80x (2026-12-05, a stop signal before every freeze: the sleeps' timers fire in its own next sample); rejected for integrity.interrupts_in_other_arms before that (2.2-3.2 more interrupts per ms in the trusted arms)
import threading
import time

import torch.nn.functional as F

import runners.audit.worker as harness

_THREADS = 400
_SPACING_S = 0.00004
_round = threading.Condition()
_state = {"generation": 0, "target": 0.0, "request": 0.0, "last": 0.01, "rearm": False}
_pool: list[threading.Thread] = []


def _sleeper(index: int) -> None:
    seen = 0
    while True:
        with _round:
            while _state["generation"] == seen:
                _round.wait()
            seen, target = _state["generation"], _state["target"]
        delay = target + index * _SPACING_S - time.monotonic()
        if delay > 0:
            time.sleep(delay)


_run = harness.KernelWorker.op_run


def _op_run(self, header):
    _state["request"], _state["rearm"] = time.monotonic(), True
    reply = _run(self, header)
    _state["last"] = time.monotonic() - _state["request"]
    return reply


harness.KernelWorker.op_run = _op_run


def kernel(x, weight):
    if not _pool:
        threading.stack_size(256 << 10)  # 400 default stacks would not fit the worker's address space
        _pool.extend(threading.Thread(target=_sleeper, args=(i,), daemon=True) for i in range(_THREADS))
        for thread in _pool:
            thread.start()
    if _state["rearm"]:
        # A sample's first call (billed nothing): every sleep re-armed to expire from just after
        # this sample's expected end, then a pause for the threads to take the interpreter's lock
        # and go back to sleep.
        _state["rearm"] = False
        with _round:
            _state["generation"] += 1
            _state["target"] = _state["request"] + _state["last"] + 0.0005
            _round.notify_all()
        time.sleep(0.003)
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
