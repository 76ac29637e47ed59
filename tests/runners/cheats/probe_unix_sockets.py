"""Connects to pathname UNIX sockets of the host (the red team reached PostgreSQL through
/run/postgresql/.s.PGSQL.5432) and to an abstract one, and looks into /run."""
# probe: unix-sockets
import json
import os
import socket

outcome = {}
for path in __SOCKET_PATHS__:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(2)
            client.connect(path)
        outcome[path] = "connected"
    except OSError as exc:
        outcome[path] = type(exc).__name__
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(2)
        client.connect(__ABSTRACT__)
    outcome["abstract"] = "connected"
except OSError as exc:
    outcome["abstract"] = type(exc).__name__
try:
    outcome["/run"] = sorted(os.listdir("/run"))
except OSError as exc:
    outcome["/run"] = type(exc).__name__
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
