"""Test setup for the optimizer: Triton's CPU interpreter, switched on before triton is imported.

Every kernel test runs the real @triton.jit code through the interpreter on small odd shapes.
"""

import os

# Must happen at import time: triton reads TRITON_INTERPRET when its JIT decorators run. The GPU
# check (benchmarks/gpu_check.py) runs the kernel tests compiled for real with
# DYNO_KERNEL_TEST_DEVICE=cuda.
if os.environ.get("DYNO_KERNEL_TEST_DEVICE", "cpu") == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
# Parallel compile workers only add noise and memory on a 2-core runner.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
