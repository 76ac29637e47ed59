"""Helpers every kernel module shares: launch-parameter checks, dtype mapping, thread scoping.

Kept tiny on purpose: a kernel file should read top to bottom without chasing helpers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
import triton.language as tl

# tl.dot's precision for float32 operands: exact float32 products, as eager PyTorch computes them
# by default. TF32 (Triton's default on a GPU) is a different result, not the same one faster:
# the float32 kernel tests missed their tolerances by 1e-2 on an H200 with it. 16-bit operands
# ignore it. A constexpr, so kernels may read it as a global.
DOT_PRECISION = tl.constexpr("ieee")

# The smallest inner (K) dimension of a tl.dot Triton compiles for NVIDIA GPUs (the interpreter
# accepts any): blocks that become a dot's K are checked against it at launch.
MIN_DOT_K = 16

def interpreting() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1), which the tests use."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def dot_upcast() -> bool:
    """Whether tl.dot operands must be upcast to float32 before the product.

    Triton 3.x's interpreter evaluates tl.dot with numpy, which has no bfloat16: a bf16 dot
    returns garbage there. On a GPU the bf16 operands go to the tensor cores unchanged.
    """
    return interpreting()


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def check_pow2(name: str, value: int) -> None:
    if value <= 0 or value & (value - 1):
        raise ValueError(f"{name}={value} must be a positive power of two (Triton block sizes are)")


def check_dot_k(name: str, value: int) -> None:
    """A block that is a tl.dot's inner dimension: a power of two, at least MIN_DOT_K."""
    check_pow2(name, value)
    if value < MIN_DOT_K:
        raise ValueError(f"{name}={value} is the inner dimension of a matrix product here and must be at least "
                         f"{MIN_DOT_K} (Triton compiles no smaller tl.dot for the GPU's tensor cores)")


def require_cuda_or_interpreter(*tensors: torch.Tensor) -> None:
    """Triton kernels launch on CUDA tensors, or on CPU tensors under the interpreter only."""
    if interpreting():
        return
    for t in tensors:
        if t.device.type != "cuda":
            raise RuntimeError(
                f"Triton kernels need CUDA tensors (got one on {t.device}); on CPU use the torch "
                "formulations in the same module, or set TRITON_INTERPRET=1 for a (slow) correctness run"
            )


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[None]:
    """Run a block with `n` intra-op threads, restoring the previous count afterwards.

    Scoped rather than global so a candidate cannot change the thread count under the baseline
    that the harness may time in the same process.
    """
    if n is None or n == torch.get_num_threads():
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def quiet_compile_threads() -> None:
    """Keep torch.compile from leaving helper threads behind after a call.

    A cold inductor cache opens a tqdm progress bar, whose monitor thread outlives the call that
    compiled; the runner's sandbox (rightly) rejects a candidate that leaves threads running.
    Compile workers are pinned to in-process compilation for the same reason.
    """
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1
    try:
        import tqdm
    except ImportError:
        return
    tqdm.tqdm.monitor_interval = 0
