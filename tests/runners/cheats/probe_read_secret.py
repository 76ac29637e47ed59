"""Reads files outside what the sandbox allows: /tmp's listing and a secret the tests plant there."""
# probe: read
import json
import os

outcome = {}
try:
    outcome["/tmp"] = "listed %d" % len(os.listdir("/tmp"))
except OSError as exc:
    outcome["/tmp"] = type(exc).__name__
try:
    with open("/tmp/dyno-probe-secret") as handle:
        outcome["secret"] = "read " + handle.read()[:20]
except OSError as exc:
    outcome["secret"] = type(exc).__name__
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
