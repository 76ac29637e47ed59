"""Never returns from its first call."""
# workload: rmsnorm
# verdict: error
# expect: sandbox.timeout


def kernel(x, weight):
    while True:
        pass
