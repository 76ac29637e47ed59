"""Returns a view of an input (a reshape that shares its storage)."""
# workload: swiglu
# verdict: rejected
# expect: integrity.output_aliases_input


def kernel(gate, up):
    return up.view(up.shape)
