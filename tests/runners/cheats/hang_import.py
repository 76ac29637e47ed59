"""Never finishes importing."""
# workload: rmsnorm
# verdict: error
# expect: sandbox.timeout
import time

time.sleep(3600)


def kernel(x, weight):
    return x
