"""Returns its input unchanged: no work at all."""
# workload: softmax
# verdict: rejected
# expect: integrity.output_aliases_input


def kernel(x):
    return x
