"""The parent<->worker wire: message framing (JSON header plus raw tensor bytes, never pickle)
and the error vocabulary that crosses it. Runs on both sides; trusts nothing it receives."""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from typing import Any, Callable, Sequence

import torch


class SandboxError(Exception):
    """A worker failed in a way that ends its evaluation; `code` is a checks.REASON_CODES key."""

    def __init__(self, code: str, message: str, detail: str = "") -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail = detail


class WorkerFault(Exception):
    """Raised inside a worker when candidate code misbehaves; travels to the parent as an error reply."""

    def __init__(self, code: str, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail


# Codes a worker may report about itself. Anything else from a candidate worker is treated as
# the candidate's doing: it runs in the same process and can forge any reply. A forged code here
# only ever condemns the candidate that sends it (none of them leads to a speedup).
SELF_REPORTED_CODES = frozenset(
    {
        "integrity.thread_left_running",
        "sandbox.import_error",
        "sandbox.no_kernel",
        "sandbox.candidate_exception",
        "sandbox.memory_limit",
        "sandbox.exit",
    }
)

# 16-byte prefix (magic, JSON length, payload length), a JSON header, raw tensor bytes.
_MAGIC = b"DYN1"
_PREFIX = struct.Struct("<4sIQ")
MAX_HEADER_BYTES = 4 << 20
WIRE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().contiguous().cpu().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def send_message(sock: socket.socket, header: dict[str, Any], tensors: Sequence[torch.Tensor] = ()) -> None:
    header = dict(header)
    header["tensors"] = [
        {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in tensors
    ]
    blobs = [_tensor_bytes(t) for t in tensors]
    body = json.dumps(header).encode()
    sock.sendall(_PREFIX.pack(_MAGIC, len(body), sum(b.nbytes for b in blobs)) + body)
    for blob in blobs:
        sock.sendall(blob)


def _recv_exact(
    sock: socket.socket, size: int, deadline: float | None, on_wait: Callable[[], None] | None
) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([sock], [], [], min(remaining, 0.1))
            if not ready:
                if on_wait is not None:
                    on_wait()
                continue
        count = sock.recv_into(view[got:], size - got)
        if count == 0:
            raise EOFError
        got += count
    return buffer


def recv_message(
    sock: socket.socket,
    *,
    deadline: float | None = None,
    max_payload: int = 1 << 40,
    on_wait: Callable[[], None] | None = None,
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """Read one message; raises TimeoutError, EOFError, or ValueError for a malformed one."""
    magic, header_len, payload_len = _PREFIX.unpack(_recv_exact(sock, _PREFIX.size, deadline, on_wait))
    if magic != _MAGIC or header_len > MAX_HEADER_BYTES or payload_len > max_payload:
        raise ValueError(f"bad message prefix (magic {magic!r}, header {header_len} B, payload {payload_len} B)")
    try:
        header = json.loads(bytes(_recv_exact(sock, header_len, deadline, on_wait)))
    except RecursionError:  # the worker's side is the candidate's: a bracket bomb is malformed, not a crash
        raise ValueError("message header nests too deeply to be a harness message") from None
    if not isinstance(header, dict):
        raise ValueError("message header is not a JSON object")
    payload = _recv_exact(sock, payload_len, deadline, on_wait) if payload_len else bytearray()
    tensors: list[torch.Tensor] = []
    offset = 0
    for item in header.get("tensors", []):
        dtype = WIRE_DTYPES.get(item.get("dtype")) if isinstance(item, dict) else None
        shape = item.get("shape") if isinstance(item, dict) else None
        if dtype is None or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"bad tensor description {item!r}")
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if offset + nbytes > len(payload):
            raise ValueError("tensor descriptions exceed the payload")
        if count:
            tensor = torch.frombuffer(payload, dtype=dtype, count=count, offset=offset).reshape(shape)
        else:
            tensor = torch.empty(shape, dtype=dtype)
        tensors.append(tensor)
        offset += nbytes
    if offset != len(payload):
        raise ValueError("payload longer than its tensor descriptions")
    return header, tensors
