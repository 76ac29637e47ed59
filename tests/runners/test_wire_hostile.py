"""The parent reads what a worker (the candidate's side) sends: a hostile header is a malformed
message (ValueError), never a crash of the trusted parent."""

from __future__ import annotations

import socket

import pytest

from runners.sandbox import wire


@pytest.mark.parametrize("header", [b"[" * 200_000, b'{"tensors": ' + b"[" * 100_000, b"\xff\xfe", b"[1, 2]"])
def test_a_hostile_header_is_a_malformed_message(header):
    left, right = socket.socketpair()
    try:
        left.sendall(wire._PREFIX.pack(wire._MAGIC, len(header), 0) + header)
        with pytest.raises(ValueError):
            wire.recv_message(right, deadline=None)
    finally:
        left.close()
        right.close()
