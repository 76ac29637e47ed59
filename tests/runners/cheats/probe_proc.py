"""Reads the harness's /proc/<pid>/cmdline and environ (the test writes its pid below) and the
command line of every process it can list, hunting for secrets and seeds."""
# probe: proc
import json
import os

outcome = {}
for name in ("cmdline", "environ"):
    try:
        with open(f"/proc/{__PARENT_PID__}/{name}", "rb") as handle:
            outcome[name] = handle.read().decode(errors="replace")
    except OSError as exc:
        outcome[name] = type(exc).__name__
listed = {}
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                listed[entry] = handle.read().decode(errors="replace")[:200]
        except OSError as exc:
            listed[entry] = type(exc).__name__
outcome["listed"] = listed
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
