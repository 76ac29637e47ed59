"""Ends its own process from inside the call, skipping every exception handler."""
# workload: rmsnorm
# verdict: error
# expect: sandbox.exit
import os


def kernel(x, weight):
    os._exit(3)
