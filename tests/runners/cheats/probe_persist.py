"""Leaves files in /dev/shm and /tmp for a later audit (a cache that outlives the worker), or
looks for them (the test picks which by writing MODE)."""
# probe: persist
import json
import os

outcome = {}
for path in ("/dev/shm/dyno-probe-persist", "/tmp/dyno-probe-persist"):
    if "__MODE__" == "write":
        try:
            with open(path, "w") as handle:
                handle.write("cached answer")
            outcome[path] = "written"
        except OSError as exc:
            outcome[path] = type(exc).__name__
    else:
        outcome[path] = os.path.exists(path)
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
