"""Tries TCP and UDP to listeners the test opens on the host's 127.0.0.1 (to exfiltrate inputs
or fetch precomputed answers), and IPv6."""
# probe: network
import json
import socket

outcome = {}
try:
    socket.create_connection(("127.0.0.1", __TCP_PORT__), timeout=2).close()
    outcome["tcp"] = "connected"
except OSError as exc:
    outcome["tcp"] = type(exc).__name__
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"dyno-probe", ("127.0.0.1", __UDP_PORT__))
    outcome["udp"] = "sent"
except OSError as exc:
    outcome["udp"] = type(exc).__name__
try:
    socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    outcome["inet6"] = "created"
except OSError as exc:
    outcome["inet6"] = type(exc).__name__
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
