"""Writes bytes of its own onto every socket it can find, to forge or corrupt the harness's replies."""
# workload: rmsnorm
# verdict: error
# expect: sandbox.protocol
import os
import stat

for fd in range(3, 64):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.write(fd, b"{\"ok\": true, \"forged\": 1}" * 8)
    except OSError:
        pass


def kernel(x, weight):
    return x
