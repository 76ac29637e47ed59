"""Helpers every kernel module shares: launch-parameter checks, dtype mapping, thread scoping.

Kept tiny on purpose: a kernel file should read top to bottom without chasing helpers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


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
