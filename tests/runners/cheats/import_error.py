"""Imports a module that does not exist."""
# workload: rmsnorm
# verdict: error
# expect: sandbox.import_error
import dyno_module_that_does_not_exist  # noqa: F401


def kernel(x, weight):
    return x
