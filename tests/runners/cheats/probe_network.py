"""Tries to open TCP connections (to exfiltrate inputs or fetch precomputed answers)."""
# probe: network
import json
import socket

outcome = {}
for port in (9, 80):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        outcome[str(port)] = "connected"
    except OSError as exc:
        outcome[str(port)] = type(exc).__name__
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
