"""What the kernel says about processes, read from /proc: CPU clocks, affinities, the process
tree, namespace pids. Trusted: runs in the parent and the zygote, never reads candidate output."""

from __future__ import annotations

import os
import time
from pathlib import Path


def process_cpu_ns(pid: int) -> int:
    """CPU time of a whole process (exited threads included), as the kernel has booked it.

    A thread's time is booked when it stops running (blocked, preempted, frozen) and at every
    scheduler tick while it runs, so a thread running at the moment of the read shows up to one
    tick (4 ms at HZ=250) less; that time is booked later and shows in the next reading. The
    harness reads at moments when the worker waits for a request or is frozen, where the figure
    is exact, and a thread the candidate leaves running only moves time later, into the next
    figure it is judged on. (A thread's own up-to-date clock cannot be read from another process:
    Linux refuses per-thread CPU clocks outside the caller's thread group, EINVAL.)
    """
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)  # CPUCLOCK_SCHED, process-wide
    except OSError:
        return 0


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


# Interrupt sources counted per core by `core_interrupts`: devices (numbered lines), the local
# timer (every hrtimer and the tick) and hypervisor callbacks. Not the inter-processor interrupts
# (rescheduling, function calls, TLB shootdowns): the parent's own core moves cause those, once per
# call in every arm alike.
_COUNTED = {"LOC", "HYP", "NMI", "TRM", "THR", "DFR", "MCE", "SPU", "PMI"}


def core_interrupts(cpus: list[int] | tuple[int, ...], text: str | None = None) -> int | None:
    """Interrupts taken so far on `cpus` (/proc/interrupts), or None where that cannot be read."""
    if text is None:
        try:
            with open("/proc/interrupts") as source:
                text = source.read()
        except OSError:
            return None
    lines = text.splitlines()
    if not lines or not cpus:
        return None
    columns = {int(name[3:]): index for index, name in enumerate(lines[0].split()) if name.startswith("CPU") and name[3:].isdigit()}
    if not all(cpu in columns for cpu in cpus):
        return None
    total = 0
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        label = label.strip()
        if not (label.isdigit() or label in _COUNTED):
            continue
        fields = rest.split()
        for cpu in cpus:
            position = columns[cpu]
            if position < len(fields) and fields[position].isdigit():
                total += int(fields[position])
    return total
