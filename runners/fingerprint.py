"""Environment fingerprint: what machine and software a result was measured on.

Every probe is best effort: a field that cannot be read is None, never a guess.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

_NVIDIA_FIELDS = (
    "name",
    "driver_version",
    "persistence_mode",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "power.draw",
    "power.limit",
    "temperature.gpu",
    "pstate",
)


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _nvidia_smi() -> dict[str, Any] | None:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        output = subprocess.run(
            [binary, f"--query-gpu={','.join(_NVIDIA_FIELDS)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [dict(zip(_NVIDIA_FIELDS, (v.strip() for v in line.split(",")))) for line in output.splitlines() if line.strip()]
    return {"gpus": rows} if rows else None


def _thp_mode() -> str | None:
    """`always`, `madvise` or `never` (the bracketed choice), None where the kernel does not say."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def _memory_reclaim() -> dict[str, Any]:
    """What the kernel does with a worker's memory behind its back, besides huge pages: the actions
    of DAMON's running schemes (`pageout` of cold regions, ...) and whether a virtio balloon reports
    free pages to the host (freed blocks are given back and fault in again when reused). Both are
    layout effects an A/A control measures; the development VM runs both (2026-12-06)."""
    actions: list[str] = []
    try:
        for state in sorted(Path("/sys/kernel/mm/damon/admin/kdamonds").glob("*/state")):
            if state.read_text().strip() == "on":
                actions += [a.read_text().strip() for a in sorted(state.parent.glob("contexts/*/schemes/*/action"))]
    except OSError:
        pass
    reporting = False
    try:
        for device in Path("/sys/bus/virtio/devices").iterdir():
            # Device id 5 is the balloon; feature bit 5 is VIRTIO_BALLOON_F_FREE_PAGE_REPORTING.
            if (device / "device").read_text().strip() == "0x0005":
                features = (device / "features").read_text().strip()
                reporting = reporting or (len(features) > 5 and features[5] == "1")
    except OSError:
        pass
    return {"damon_actions": actions, "free_page_reporting": reporting}


def gpu_uuid(index: int = 0) -> str | None:
    """The UUID of the GPU this process sees as `index` (`GPU-...` as nvidia-smi prints it), or None."""
    import torch

    try:
        raw = str(torch.cuda.get_device_properties(index).uuid)
    except (AttributeError, RuntimeError, AssertionError):
        return None
    return raw if raw.startswith("GPU-") else f"GPU-{raw}"


def environment_fingerprint(device: str = "cpu", *, threads: int | None = None) -> dict[str, Any]:
    """Device, driver, CUDA, torch, triton, Python, CPU, threads, host and load at measurement time.

    `threads` is the intra-op thread count measurements ran with (default: this process's).
    """
    import torch

    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    info: dict[str, Any] = {
        "device": "cpu",
        "device_name": "cpu",
        "driver": None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "hostname": socket.gethostname(),
        "load_average": list(os.getloadavg()),
        # The kernel's transparent-huge-page mode: it decides which pages a worker's tensors land
        # on, one of the layout effects an A/A control measures.
        "transparent_hugepage": _thp_mode(),
        "memory_reclaim": _memory_reclaim(),
        "gpu": None,
    }
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        properties = torch.cuda.get_device_properties(index)
        smi = _nvidia_smi()
        info.update(
            device=device,
            device_name=properties.name,
            gpu={
                "name": properties.name,
                # The physical GPU, whatever index this process sees it at: what one worker per GPU
                # is bound to, and what the device lock of a host is keyed on.
                "uuid": gpu_uuid(index),
                "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "memory_bytes": properties.total_memory,
                "multiprocessors": properties.multi_processor_count,
                "capability": f"{properties.major}.{properties.minor}",
                "nvidia_smi": smi,
            },
        )
        if smi and smi["gpus"]:
            info["driver"] = smi["gpus"][min(index, len(smi["gpus"]) - 1)].get("driver_version")
    return info
