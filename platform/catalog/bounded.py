"""Run one function on hostile input in a forked child under CPU, memory and wall-clock limits.

Building a model's module tree from an uploaded config.json runs the architecture's own Python
with sizes the uploader chose. Whatever it costs is paid by a short-lived child of the web process,
not by the request's own process: the child gets an address-space limit above what it inherited, a
CPU-time limit and a wall-clock deadline, and hands back one JSON value through a pipe.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import time
from typing import Any, Callable

_RESULT_MAX_BYTES = 64 * 1024


class BoundedFailure(Exception):
    """The child did not return a value: `kind` is "time", "memory" or "error"."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _child(fn: Callable[[], Any], write_fd: int, cpu_seconds: int, memory_bytes: int) -> None:
    try:
        limit = _address_space_bytes() + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        try:
            payload = {"value": fn()}
        except MemoryError:
            payload = {"failure": "memory", "detail": "MemoryError"}
        except RecursionError:
            payload = {"failure": "error", "detail": "RecursionError"}
        except BaseException as exc:  # noqa: BLE001 - the caller decides what any failure means
            payload = {"failure": "error", "detail": type(exc).__name__, "message": str(exc)[:500]}
        data = json.dumps(payload).encode()[:_RESULT_MAX_BYTES]
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view):]
    finally:
        os._exit(0)


def run_bounded(fn: Callable[[], Any], *, wall_seconds: float, cpu_seconds: int, memory_bytes: int) -> Any:
    """`fn()` in a forked child; its JSON-serialisable return value, or BoundedFailure.

    The parent reads at most 64 KiB back and kills the child at the deadline. `memory_bytes` is
    what the child may map beyond the address space it inherited."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's lines are measured by what the parent reads
        os.close(read_fd)
        _child(fn, write_fd, cpu_seconds, memory_bytes)
    os.close(write_fd)
    chunks: list[bytes] = []
    received = 0
    deadline = time.monotonic() + wall_seconds
    timed_out = False
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([read_fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            received += len(chunk)
            if received <= _RESULT_MAX_BYTES:
                chunks.append(chunk)
    finally:
        os.close(read_fd)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if timed_out:
        raise BoundedFailure("time", f"no answer within {wall_seconds:g} s")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        kind = "time" if sig == signal.SIGXCPU else "memory" if sig in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS) else "error"
        raise BoundedFailure(kind, f"the child ended on {signal.Signals(sig).name}")
    try:
        payload = json.loads(b"".join(chunks))
    except ValueError:
        raise BoundedFailure("error", "the child's answer was cut off or not JSON") from None
    if "failure" in payload:
        raise BoundedFailure(str(payload["failure"]), str(payload.get("detail", "")))
    return payload["value"]
