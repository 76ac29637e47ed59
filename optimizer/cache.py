"""Tuning cache: which candidate won for a family, shape bucket, dtype, hardware and code version.

Keys bucket the batch-like dimension to a power of two (a new batch size inside a tuned bucket
reuses the config) and pin everything that can change the answer: hardware fingerprint, torch
and triton versions, and a hash of the kernel sources. The default store is a JSON-lines file
safe for concurrent appends; `TuningCache` is the interface a database can implement later.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

SCHEMA = "dyno.tuning-cache/1"

# The dimension(s) of each family that vary with batch size (and, for decode, with the growing
# cache); every other dimension is part of the key exactly.
BUCKETED_DIMS: dict[str, tuple[str, ...]] = {
    "rmsnorm": ("R",),
    "layernorm": ("R",),
    "softmax": ("R",),
    "swiglu": ("R",),
    "rope": ("B",),
    "gemm": ("M",),
    "attention_prefill": ("B",),
    "attention_decode": ("B", "L"),
    "moe": ("T",),
    "ssm_scan": ("B",),
}

_KERNELS_DIR = Path(__file__).resolve().parent / "kernels"
_IMPORT_RE = re.compile(r"^from optimizer\.kernels\.(\w+) import|^from optimizer\.kernels import (\w+)", re.M)


def bucket(n: int) -> int:
    """The power of two at or above n (1 for n <= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def shape_bucket(family: str, shape: dict[str, int]) -> dict[str, int]:
    dims = BUCKETED_DIMS.get(family, ())
    return {k: (bucket(v) if k in dims else int(v)) for k, v in sorted(shape.items())}


def kernels_sha256(family: str) -> str:
    """Hash of the code that decides what a family's candidates compute: its kernel module, the
    kernel modules that one imports (transitively), and the candidate/search definitions."""
    seen: set[str] = set()
    pending = [family, "_common"]
    while pending:
        name = pending.pop()
        if name in seen or not (_KERNELS_DIR / f"{name}.py").exists():
            continue
        seen.add(name)
        text = (_KERNELS_DIR / f"{name}.py").read_text(encoding="utf-8")
        pending += [a or b for a, b in _IMPORT_RE.findall(text)]
    return sources_sha256([_KERNELS_DIR / f"{n}.py" for n in sorted(seen)] + [
        Path(__file__).resolve().parent / "candidates.py",
        Path(__file__).resolve().parent / "search.py",
    ])


def sources_sha256(paths: list[Path]) -> str:
    """One hash over source files, each by its name and bytes, in the order given."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class TuningKey:
    family: str
    shape_bucket: tuple[tuple[str, int], ...]
    dtype: str
    hardware: str
    device: str
    torch_version: str
    triton_version: str
    kernels_sha256: str

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape_bucket"] = dict(self.shape_bucket)
        return out

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def _versions() -> tuple[str, str]:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    return torch.__version__, triton_version


def make_key(
    family: str,
    shape: dict[str, int],
    dtype: str,
    *,
    hardware: str,
    device: str,
    torch_version: str | None = None,
    triton_version: str | None = None,
    source_sha256: str | None = None,
) -> TuningKey:
    """The cache key of a workload; versions and source hash default to the running ones."""
    tv, trv = _versions()
    return TuningKey(
        family=family,
        shape_bucket=tuple(shape_bucket(family, shape).items()),
        dtype=dtype,
        hardware=hardware,
        device=device,
        torch_version=torch_version or tv,
        triton_version=triton_version or trv,
        kernels_sha256=source_sha256 or kernels_sha256(family),
    )


@dataclass(frozen=True)
class TuningEntry:
    """What a search decided: the candidate (by its params, which re-render its source), the
    exact shape it was tuned at, the estimated speedup and the seconds the search took."""

    params: dict[str, Any]
    candidate: str
    source_sha256: str
    shape: dict[str, int]
    speedup_estimate: float | None
    tuning_seconds: float
    created_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuningEntry:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class TuningCache(Protocol):
    """Storage for tuning decisions; the platform may back it with its database."""

    def get(self, key: TuningKey) -> TuningEntry | None: ...

    def put(self, key: TuningKey, entry: TuningEntry) -> None: ...


class MemoryTuningCache:
    """In-process cache (tests, one-off runs)."""

    def __init__(self) -> None:
        self._entries: dict[str, TuningEntry] = {}

    def get(self, key: TuningKey) -> TuningEntry | None:
        return self._entries.get(key.digest())

    def put(self, key: TuningKey, entry: TuningEntry) -> None:
        self._entries[key.digest()] = entry


class JsonlTuningCache:
    """Append-only JSON lines: one line per decision, the newest line for a key wins.

    Writers take an exclusive flock and append one whole line with a single write(2) on an
    O_APPEND descriptor, so concurrent processes never interleave. A writer killed mid-line
    leaves a torn line: readers skip any line that does not parse, and the next writer starts
    on a fresh line so its own record stays intact.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def get(self, key: TuningKey) -> TuningEntry | None:
        digest = key.digest()
        found: TuningEntry | None = None
        for record in self._records():
            if record.get("key_digest") == digest:
                found = TuningEntry.from_dict(record["entry"])
        return found

    def put(self, key: TuningKey, entry: TuningEntry) -> None:
        record = {"schema": SCHEMA, "key_digest": key.digest(), "key": key.to_dict(), "entry": entry.to_dict()}
        line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and not _ends_with_newline(self.path, size):
                line = b"\n" + line
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"short write to tuning cache {self.path}: {written} of {len(line)} bytes")
            os.fsync(fd)
        finally:
            os.close(fd)  # releases the lock

    def _records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH)
            data = f.read()
        records = []
        for n, raw in enumerate(data.split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError:
                log.warning("tuning cache %s: skipping unreadable line %d (torn write?)", self.path, n)
                continue
            if isinstance(record, dict) and record.get("schema") == SCHEMA and isinstance(record.get("entry"), dict):
                records.append(record)
        return records


def _ends_with_newline(path: Path, size: int) -> bool:
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1) == b"\n"
