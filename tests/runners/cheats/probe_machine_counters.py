"""Reads the machine's per-core counters: interrupts (a rescheduling interrupt per call the
parent fences, on the measurement core), softirqs, per-CPU times and scheduler statistics. From
them a worker could count the calls other arms ran between two of its samples, and learn its
place in the round's secret order. Reports how many bytes each file gave."""
# probe: machine-counters
import json
import os

outcome = {}
for path in ("/proc/interrupts", "/proc/softirqs", "/proc/stat", "/proc/schedstat"):
    try:
        with open(path) as handle:
            outcome[path] = len(handle.read())
    except OSError as exc:
        outcome[path] = f"error {exc.errno}"
outcome["cpu_count"] = os.cpu_count()
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
