"""The audit engine: inputs the parent writes, the worker beside the candidate, samples, the kernel
audit and its outcome. `runners.evaluate` holds the public entry points."""
