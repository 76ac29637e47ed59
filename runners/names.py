"""The suite's names, without its kernels: what the web tier may import (it loads no torch).

`runners.suite` owns the workloads themselves; tests/runners/test_suite.py checks that these names
are exactly its own, in its order.
"""

SUITE_VERSION = "1"  # what reports name as suite.version, and contracts' measurement plans pin
WORKLOAD_NAMES: tuple[str, ...] = (
    "rmsnorm", "layernorm", "softmax", "swiglu", "rope", "gemm",
    "attention_prefill", "attention_decode", "moe", "ssm_scan",
)
PROFILE_NAMES: tuple[str, ...] = ("cpu-ci", "cpu", "gpu")


def workload_names() -> list[str]:
    return list(WORKLOAD_NAMES)
