"""Creates sockets of families that reach the kernel or the host's network stack directly
(netlink: routes and audit; packet: raw frames)."""
# probe: socket-families
import json
import socket

outcome = {}
for name, args in {
    "netlink": (socket.AF_NETLINK, socket.SOCK_RAW, 0),
    "packet": (socket.AF_PACKET, socket.SOCK_RAW, 0),
    "inet_raw": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
}.items():
    try:
        socket.socket(*args).close()
        outcome[name] = "created"
    except OSError as exc:
        outcome[name] = type(exc).__name__
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
