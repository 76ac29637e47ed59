"""Tries to signal every other process (signal 0 only checks permission; a real attack would
SIGSTOP the baseline worker while it is being timed)."""
# probe: signals
import json
import os

reachable = []
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != os.getpid():
        try:
            os.kill(int(entry), 0)
            reachable.append(int(entry))
        except OSError:
            pass
raise RuntimeError("PROBE-REPORT " + json.dumps({"reachable": reachable}))
