"""One module per workload family (plus fused variants): a private @triton.jit kernel with a plain
launcher exposing its tunables, and the torch formulations the CPU candidates compile or run."""
