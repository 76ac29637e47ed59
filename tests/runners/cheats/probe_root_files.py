"""Reads files only root may read: /etc/shadow, and a mode-600 root file the test plants in a
directory the sandbox may read."""
# probe: root-files
import json

outcome = {}
for path in ("/etc/shadow", "/etc/gshadow", __ROOT_ONLY__):
    try:
        with open(path) as handle:
            outcome[path] = "read " + handle.read()[:20]
    except OSError as exc:
        outcome[path] = type(exc).__name__
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
