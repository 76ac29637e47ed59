"""Writes through a wild pointer inside the call."""
# workload: rmsnorm
# verdict: error
# expect: sandbox.crash
import ctypes


def kernel(x, weight):
    ctypes.memset(0xDEAD0000, 0, 64)
    return x
