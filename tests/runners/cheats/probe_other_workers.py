"""Tries to reach the other workers of the sandbox (the trusted baseline it is measured against)
through the calls the kernel allows on processes of one's own uid: renice, reschedule to
SCHED_IDLE, lower a resource limit (prlimit), and signal 0 (the permission check of kill)."""
# probe: other-workers
import json
import os
import resource

me = os.getpid()
seen, allowed = [], {"setpriority": [], "sched_setscheduler": [], "prlimit": [], "kill": []}
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == me:
        continue
    pid = int(entry)
    try:
        with open(f"/proc/{pid}/status") as status:
            uid = next(line.split()[1] for line in status if line.startswith("Uid:"))
    except (OSError, StopIteration):
        continue
    seen.append({"pid": pid, "uid": int(uid)})
    attempts = {
        "setpriority": lambda: os.setpriority(os.PRIO_PROCESS, pid, 19),
        "sched_setscheduler": lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)),
        "prlimit": lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, resource.prlimit(pid, resource.RLIMIT_NOFILE)),
        "kill": lambda: os.kill(pid, 0),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            allowed[name].append(pid)
        except OSError:
            pass
raise RuntimeError("PROBE-REPORT " + json.dumps({"me": os.getuid(), "seen": seen, "allowed": allowed}))
