"""Snapshot reads a worker can stall (runners.audit.sample, KernelAudit._snapshots_stalled).

The parent reads a call's outputs through /proc/PID/mem the moment the worker reports it done. The
read takes the worker's memory-map lock; a worker holding that lock for writing (a thread in a long
mprotect) makes the read wait until it has finished the output it claimed was done. A red team's
candidate passed every snapshot that way (2026-12-05). The parent now marks a read during which its
own thread went to sleep, which an uncontended read never does, and a share of such reads fails."""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing
import os
import resource
import time
import types

from runners.audit.kernel import SNAPSHOT_STALLS_FAIL, KernelAudit
from runners.audit.outcome import Outcome

_REGION = 256 << 20


def _hold_map_lock(ready, address_out) -> None:
    """Change the protection of a large populated region back and forth, forever: each mprotect
    holds the process's memory-map lock for writing while it rewrites every page's entry."""
    libc = ctypes.CDLL(None, use_errno=True)
    region = mmap.mmap(-1, _REGION, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.write(b"\1" * _REGION)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    address_out.value = address
    ready.set()
    while True:
        libc.mprotect(ctypes.c_void_p(address), ctypes.c_size_t(_REGION), 1)
        libc.mprotect(ctypes.c_void_p(address), ctypes.c_size_t(_REGION), 3)


def _blocked_reads(pid: int, address: int, reads: int) -> int:
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    blocked = 0
    try:
        for _ in range(reads):
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
            os.pread(fd, 1 << 16, address)
            blocked += resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw != before
            time.sleep(0.0005)
    finally:
        os.close(fd)
    return blocked


def _blocked_reads_of(target, reads: int = 200) -> int:
    context = multiprocessing.get_context("fork")
    ready, address = context.Event(), context.Value("Q", 0, lock=False)
    process = context.Process(target=target, args=(ready, address), daemon=True)
    process.start()
    try:
        assert ready.wait(60)
        return _blocked_reads(process.pid, address.value, reads)
    finally:
        process.kill()
        process.join()


def test_a_read_of_a_process_holding_its_memory_map_lock_shows_as_the_reader_blocking():
    held = _blocked_reads_of(_hold_map_lock)
    free = _blocked_reads_of(_spin_with_region)  # the same reads of a process that only computes
    assert held >= 50, held  # most reads wait on the lock (on the 2-core VM: 200 of 200)
    assert free <= 5, free  # (0 of 200)


def _spin_with_region(ready, address_out) -> None:
    region = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.write(b"\1" * (1 << 20))
    address_out.value = ctypes.addressof(ctypes.c_char.from_buffer(region))
    ready.set()
    x = 0
    while True:
        x += 1


def _audit() -> KernelAudit:
    audit = KernelAudit.__new__(KernelAudit)
    audit.outcome = Outcome(spec=types.SimpleNamespace(key="rmsnorm"))
    audit.snapshot_reads = audit.snapshot_stalls = 0
    return audit


def _sample(reads: int, stalls: int):
    return types.SimpleNamespace(snapshots=dict.fromkeys(range(reads)), snapshot_stalls=stalls)


def test_a_stray_stalled_read_passes_and_a_share_of_them_fails():
    audit = _audit()
    # An honest worker: one read in a hundred waits (an allocation at the wrong moment).
    for round_index in range(30):
        assert audit._snapshots_stalled(_sample(4, 1 if round_index % 10 == 0 else 0), f"round {round_index}") == []
    assert audit.outcome.timing["snapshot_reads"] == 120 and audit.outcome.timing["snapshot_stalls"] == 3
    # A worker that stalls every read it can: caught as soon as the count is reached.
    audit = _audit()
    reasons = []
    for round_index in range(SNAPSHOT_STALLS_FAIL):
        reasons = audit._snapshots_stalled(_sample(1, 1), f"round {round_index + 1}")
    assert [r.code for r in reasons] == ["timing.snapshot_stalled"]
    assert f"{SNAPSHOT_STALLS_FAIL} of {SNAPSHOT_STALLS_FAIL} reads" in reasons[0].message
