"""A forked helper widens its CPU mask to a core outside the measurement cores (the test writes
which) and stays alive, so it could compute on the harness's core."""
# probe: forked-affinity
import json
import os
import time

read_end, write_end = os.pipe()
if os.fork() == 0:
    try:
        os.sched_setaffinity(0, {__OUTSIDE_CORE__})
        outcome = "widened"
    except OSError as exc:
        outcome = type(exc).__name__
    os.write(write_end, json.dumps({"setaffinity": outcome, "mask": sorted(os.sched_getaffinity(0))}).encode())
    while True:
        time.sleep(1)
os.close(write_end)
RESULT = json.loads(os.read(read_end, 4096))


def report():
    return RESULT
