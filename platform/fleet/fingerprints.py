"""What identifies a runner's device and software, as one digest. Pure: imported by the runner side
(which holds no database credentials) and by the control side that stores it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# What identifies a device and its software; the load average and GPU clocks change by the minute.
IDENTITY_KEYS = ("device", "device_name", "driver", "cuda", "torch", "triton", "python", "platform",
                 "cpu_model", "cpu_count", "hostname")


def fingerprint_digest(fingerprint: dict[str, Any]) -> str:
    identity = {key: fingerprint.get(key) for key in IDENTITY_KEYS}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()
