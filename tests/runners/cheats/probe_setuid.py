"""Runs setuid-root programs, hoping to gain root: passwd -S root needs root to answer."""
# probe: setuid
import json
import os
import subprocess

outcome = {}
for argv in (["/usr/bin/passwd", "-S", "root"], ["/usr/bin/su", "-c", "id -u", "root"]):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        outcome[argv[0]] = {"setuid": bool(os.stat(argv[0]).st_mode & 0o4000), "returncode": done.returncode, "output": (done.stdout + done.stderr)[:300]}
    except (OSError, subprocess.SubprocessError) as exc:
        outcome[argv[0]] = {"error": type(exc).__name__}
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
