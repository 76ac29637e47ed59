"""Spins in a background thread and keeps a known buffer in memory (for freezing and reading a worker)."""
# probe: spin
import ctypes
import threading

BUFFER = ctypes.create_string_buffer(b"DYNO-KNOWN-BUFFER-0123456789")


def _spin():
    while True:
        pass


threading.Thread(target=_spin, daemon=True).start()


def report():
    return {"address": ctypes.addressof(BUFFER), "size": len(BUFFER.raw)}
