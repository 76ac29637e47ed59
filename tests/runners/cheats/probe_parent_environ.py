"""Reads /proc/<pid>/environ of every process it can see, hunting for the harness's secrets."""
# probe: proc-environ
import json
import os

readable = []
leaked = False
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
        continue
    try:
        with open(f"/proc/{entry}/environ", "rb") as handle:
            data = handle.read()
    except OSError:
        continue
    readable.append(int(entry))
    leaked = leaked or b"DYNO_PROBE_CANARY" in data
raise RuntimeError("PROBE-REPORT " + json.dumps({"readable": readable, "leaked": leaked}))
