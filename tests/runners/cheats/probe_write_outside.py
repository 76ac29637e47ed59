"""Tries to write into the installation, /tmp and the sandbox root; writes its scratch dir as a control."""
# probe: write
import json
import os

import runners

targets = {
    "repo": os.path.join(os.path.dirname(os.path.dirname(runners.__file__)), "dyno_sandbox_escape.txt"),
    "package": os.path.join(os.path.dirname(runners.__file__), "dyno_sandbox_escape.py"),
    "tmp": "/tmp/dyno_sandbox_escape.txt",
    "sandbox_root": os.path.join(os.path.dirname(os.getcwd()), "dyno_sandbox_escape.txt"),
    "scratch": os.path.join(os.getcwd(), "allowed.txt"),
}
report = {}
for name, path in targets.items():
    try:
        with open(path, "w") as handle:
            handle.write("escaped")
        report[name] = "written"
    except OSError as exc:
        report[name] = type(exc).__name__
raise RuntimeError("PROBE-REPORT " + json.dumps(report))
