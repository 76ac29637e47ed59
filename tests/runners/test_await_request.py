"""A worker expecting its next request at once polls for it rather than sleeping in recv
(runners.sandbox.zygote.serve): every worker alike, so waking up is no candidate's lever."""

from __future__ import annotations

import socket
import threading
import time

from runners.sandbox.wire import recv_message, send_message
from runners.sandbox.zygote import AWAIT_POLL_S, serve


class _Handler:
    def __init__(self, soon: bool) -> None:
        self.soon = soon
        self.next_request_soon = False

    def handle(self, op, header, tensors):
        self.next_request_soon = self.soon
        return {"echo": header.get("n")}, []


def _cpu_while_waiting(soon: bool) -> float:
    """CPU seconds the process used while its serving thread waited 40 ms for a request."""
    parent, child = socket.socketpair()
    thread = threading.Thread(target=serve, args=(child, _Handler(soon)), daemon=True)
    thread.start()
    try:
        send_message(parent, {"op": "step", "n": 1})
        assert recv_message(parent, deadline=time.monotonic() + 5)[0]["echo"] == 1
        before = time.process_time()
        time.sleep(0.04)
        used = time.process_time() - before
        send_message(parent, {"op": "step", "n": 2})  # still answered after the poll
        assert recv_message(parent, deadline=time.monotonic() + 5)[0]["echo"] == 2
        send_message(parent, {"op": "exit"})
        thread.join(5)
        return used
    finally:
        parent.close()
        child.close()


def test_a_worker_polls_for_a_request_it_expects_at_once_and_sleeps_otherwise():
    assert AWAIT_POLL_S >= 0.04
    assert _cpu_while_waiting(True) > 0.02
    assert _cpu_while_waiting(False) < 0.01
