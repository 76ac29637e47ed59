"""Opens raw devices: physical memory, disks, the kernel log."""
# probe: devices
import glob
import json
import os

try:
    outcome = {"listing": sorted(os.listdir("/dev"))}
except OSError as exc:
    outcome = {"listing": type(exc).__name__}
outcome["present"] = sorted(p for p in ("/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/nvme0n1") if os.path.exists(p))
for path in ["/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/nvme0n1", *glob.glob("/dev/sd*"), *glob.glob("/dev/vd*")]:
    try:
        with open(path, "rb") as handle:
            handle.read(16)
        outcome[path] = "read"
    except OSError as exc:
        outcome[path] = type(exc).__name__
raise RuntimeError("PROBE-REPORT " + json.dumps(outcome))
