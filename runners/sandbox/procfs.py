"""What the kernel says about processes, read from /proc: CPU clocks, affinities, the process
tree, namespace pids. Trusted: runs in the parent and the zygote, never reads candidate output."""

from __future__ import annotations

import os
import time
from pathlib import Path


def thread_clock_ns(tid: int) -> int:
    """A thread's CPU clock. Reading it also books the thread's running time into its counters
    (schedstat, cpuacct), which otherwise lag a running thread by up to a scheduler tick."""
    return time.clock_gettime_ns(((~tid) << 3) | 2 | 4)  # CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD


def process_cpu_ns(pid: int) -> int:
    """CPU time of a whole process, precise to the nanosecond.

    The process-wide CPU clock of another process lags for threads that are running (their time
    is booked at scheduler ticks); per-thread clocks are brought up to date when read. So: the
    process clock (which also holds exited threads) plus each live thread's unbooked time.
    """
    try:
        total = time.clock_gettime_ns(((~pid) << 3) | 2)  # CPUCLOCK_SCHED, process-wide
    except OSError:
        return 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return total
    for name in tids:
        tid = int(name)
        try:
            with open(f"/proc/{pid}/task/{name}/schedstat") as handle:
                booked = int(handle.read().split()[0])
            now = thread_clock_ns(tid)
        except (OSError, ValueError, IndexError):
            continue
        total += max(0, now - booked)
    return total


def default_threads() -> int:
    # One core stays free for the parent and the OS (see runners.measure.Protocol.threads).
    return max(1, len(os.sched_getaffinity(0)) - 1)


def measurement_cpus(threads: int) -> list[int]:
    """The cores every worker of a sandbox is pinned to: all but the lowest core this process may
    use (left to the parent and the OS), at most `threads` of them; none on a one-core machine.

    Baseline, candidate and A/A control then all run on the same cores. Left to the scheduler,
    each worker settles on a core of its own and keeps it; on a VM whose cores differ (a busy
    hyperthread sibling on the host, another tenant), one worker stays 10-30% slower than an
    identical one for a whole audit, and the speedup measures the cores, not the kernel."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return []
    return allowed[1 : 1 + max(1, threads)]


def cpu_list(text: str) -> set[int]:
    """`0-2,5` -> {0, 1, 2, 5} (the kernel's Cpus_allowed_list format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def thread_affinities(pid: int) -> list[set[int]]:
    """The CPUs each live thread of `pid` may run on, read from /proc (empty once it is gone)."""
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as handle:
                for line in handle:
                    if line.startswith("Cpus_allowed_list:"):
                        found.append(cpu_list(line.split(":", 1)[1]))
                        break
        except OSError:
            continue  # the thread ended while we looked
    return found


def process_table() -> dict[int, int]:
    """pid -> parent pid for every visible process."""
    table: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(entry)] = int(fields[1])
    return table


def descendants(root: int, table: dict[int, int]) -> list[int]:
    found: list[int] = []
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in table.items() if ppid == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def status_field(pid: int, name: str) -> list[str]:
    """The values of one /proc/<pid>/status line (`Uid`, `NSpid`, ...); empty when unreadable."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(name + ":"):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def host_pid(ns_pid: int, *, under: int) -> int | None:
    """The pid, in this process's namespace, of the descendant of `under` that is `ns_pid` in its
    own (innermost) PID namespace."""
    for pid in descendants(under, process_table()):
        nspids = status_field(pid, "NSpid")
        if nspids and int(nspids[-1]) == ns_pid:
            return pid
    return None
