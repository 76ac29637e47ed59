"""Does its work in a forked helper process, whose CPU a harness counting only the worker's
own threads would never see."""
# probe: forked-spin
import os
import time


def report():
    pid = os.fork()
    if pid == 0:
        start = time.process_time()
        while time.process_time() - start < 0.3:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
    return {"child": pid}
