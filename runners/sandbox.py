"""Sandboxed execution: a zygote process that forks one isolated worker per candidate.

Owns process isolation (allow-listed environment, private scratch directory, resource limits,
privilege drop, Landlock rules for files, TCP and signals), the parent<->worker wire format,
and turning how a worker failed (timeout, crash, memory) into reason codes.

Why a zygote: importing torch costs ~2 s, and the optimizer's search evaluates many candidates.
The zygote imports torch once (running nothing parallel and touching no GPU, so forking is
safe); each worker is a fresh fork that locks itself down before it loads any candidate code.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import pwd
import resource
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------------------------
# Errors


class SandboxError(Exception):
    """A worker failed in a way that ends its evaluation; `code` is a verify.REASON_CODES key."""

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
_SELF_REPORTED_CODES = frozenset(
    {
        "integrity.thread_left_running",
        "sandbox.import_error",
        "sandbox.no_kernel",
        "sandbox.candidate_exception",
        "sandbox.memory_limit",
        "sandbox.exit",
    }
)

# --------------------------------------------------------------------------------------------
# Wire format: 16-byte prefix (magic, JSON length, payload length), a JSON header, raw tensor
# bytes. No pickle: the parent must never deserialize code from a candidate.

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
    header = json.loads(bytes(_recv_exact(sock, header_len, deadline, on_wait)))
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


# --------------------------------------------------------------------------------------------
# Environment: an allow-list. Anything not named here (DATABASE_URL, DYNO_SECRET_KEY, AWS_*,
# *_API_KEY, CELERY_BROKER_URL, signing key paths, ...) never reaches candidate code.

ENV_PASSTHROUGH: tuple[str, ...] = (
    "PATH",
    "LANG",
    "LC_ALL",
    "TZ",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
    "TRITON_INTERPRET",
    "TRITON_PTXAS_PATH",
    "TRITON_LIBCUDA_PATH",
)


def sandbox_environment(source: dict[str, str], *, home: str, threads: int) -> dict[str, str]:
    """The complete environment a sandboxed process gets: allow-listed names plus fixed values."""
    env = {name: source[name] for name in ENV_PASSTHROUGH if name in source}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(_home_environment(home))
    env.update(
        PYTHONPATH=str(REPO_ROOT),
        PYTHONNOUSERSITE="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        # Inductor's default compile pool forks helper processes that outlive the call; in-process
        # compilation keeps the stray-process check meaningful.
        TORCHINDUCTOR_COMPILE_THREADS="1",
        **MALLOC_ENVIRONMENT,
    )
    return env


# glibc serves a large block from a fresh mapping (a page fault per 4 KiB on first touch) until a
# freed mapping teaches it to use the heap instead, and trims the heap back to the OS when its top
# is free. Both depend on the process's history, so two identical workers ran the same softmax
# at 0 and at 900 page faults per call, 1.3 ms against 2.5 ms, for a whole audit. Fixed
# thresholds (which also switch the adaptation off) give every worker the same allocator: blocks
# up to 32 MiB (glibc's ceiling) come from a heap that is never trimmed, so after the warm-up a
# sample measures the kernel, not the kernel's page faults.
MALLOC_ENVIRONMENT = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
}


def _home_environment(home: str) -> dict[str, str]:
    return {
        "HOME": home,
        "TMPDIR": os.path.join(home, "tmp"),
        "XDG_CACHE_HOME": os.path.join(home, "cache"),
        "TRITON_CACHE_DIR": os.path.join(home, "triton"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(home, "inductor"),
    }


# --------------------------------------------------------------------------------------------
# Linux primitives (prctl, capabilities, Landlock) through libc.

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_SYS_LANDLOCK_CREATE_RULESET = 444  # same number on every architecture
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}.get(platform.machine())


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def _drop_capabilities() -> None:
    """Leave uid 0 without any capability, so it cannot override permissions or regain them."""
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            break  # EINVAL past the last capability
    if _SYS_CAPSET is None:
        raise OSError(errno.ENOSYS, f"capset syscall number unknown on {platform.machine()}")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable for both 32-bit halves: all zero
    if _libc.syscall(_SYS_CAPSET, header, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset failed: {os.strerror(err)}")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when unavailable."""
    version = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_READ = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR


def _apply_landlock(*, abi: int, writable: Sequence[str], readable: Sequence[str], listable: Sequence[str]) -> None:
    """Restrict this process: write only under `writable`, read only under `readable`, list
    `listable`; no TCP bind/connect (ABI >= 4); no signals or abstract sockets outside (ABI >= 6).

    Landlock also confines ptrace and /proc/<pid>/environ|mem to processes in the same domain,
    so a worker cannot read the parent's environment even while it still runs as the same uid.
    """
    fs_bits = {1: 13, 2: 14}.get(abi, 15)  # REFER arrives in ABI 2, TRUNCATE in ABI 3
    handled_fs = (1 << fs_bits) - 1
    attr = _RulesetAttr(
        handled_access_fs=handled_fs,
        handled_access_net=0b11 if abi >= 4 else 0,
        scoped=0b11 if abi >= 6 else 0,
    )
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for paths, access in ((writable, handled_fs), (readable, _FS_READ), (listable, _FS_READ_DIR)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # a root that does not exist on this machine
                try:
                    allowed = access if stat.S_ISDIR(os.fstat(fd).st_mode) else access & (_FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | (1 << 14))
                    rule = _PathBeneathAttr(allowed_access=allowed & handled_fs, parent_fd=fd)
                    if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
                finally:
                    os.close(fd)
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


def _read_roots() -> list[str]:
    """What a worker may read: the interpreter, the venv, system libraries and compilers, /proc,
    /sys, /dev, and of this repository only the packages candidates may import."""
    roots = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        "/usr",
        "/lib",
        "/lib32",
        "/lib64",
        "/bin",
        "/sbin",
        "/etc",
        "/opt",
        "/proc",
        "/sys",
        "/run/nvidia-persistenced",
        str(REPO_ROOT / "runners"),
        str(REPO_ROOT / "optimizer"),
    }
    return sorted(roots)


def _readable_by_others(path: str) -> bool:
    """Whether a process of another, unprivileged uid could read `path` (all parents searchable)."""
    current = Path(path).resolve()
    try:
        if not os.stat(current).st_mode & stat.S_IROTH:
            return False
        for parent in current.parents:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
    except OSError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Configuration and the parent-side handles.


def process_cpu_ns(pid: int) -> int:
    """CPU time of a whole process, precise to the nanosecond.

    The process-wide CPU clock of another process lags for threads that are running (their time
    is booked at scheduler ticks); per-thread clocks are brought up to date when read. So: the
    process clock (which also holds exited threads) plus each live thread's unbooked time.
    """
    try:
        total = time.clock_gettime_ns(((~pid) << 3) | 2)  # CPUCLOCK_SCHED, process-wide
    except OSError:
        return 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return total
    for name in tids:
        tid = int(name)
        try:
            with open(f"/proc/{pid}/task/{name}/schedstat") as handle:
                booked = int(handle.read().split()[0])
            now = time.clock_gettime_ns(((~tid) << 3) | 2 | 4)  # CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD
        except (OSError, ValueError, IndexError):
            continue
        total += max(0, now - booked)
    return total


def _default_threads() -> int:
    # One core stays free for the parent and the OS (see runners.measure.Protocol.threads).
    return max(1, len(os.sched_getaffinity(0)) - 1)


def measurement_cpus(threads: int) -> list[int]:
    """The cores every worker of a sandbox is pinned to: all but the lowest core this process may
    use (left to the parent and the OS), at most `threads` of them; none on a one-core machine.

    Baseline, candidate and A/A control then all run on the same cores. Left to the scheduler,
    each worker settles on a core of its own and keeps it; on a VM whose cores differ (a busy
    hyperthread sibling on the host, another tenant), one worker stays 10-30% slower than an
    identical one for a whole audit, and the speedup measures the cores, not the kernel."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return []
    return allowed[1 : 1 + max(1, threads)]


def _cpu_list(text: str) -> set[int]:
    """`0-2,5` -> {0, 1, 2, 5} (the kernel's Cpus_allowed_list format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def thread_affinities(pid: int) -> list[set[int]]:
    """The CPUs each live thread of `pid` may run on, read from /proc (empty once it is gone)."""
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as handle:
                for line in handle:
                    if line.startswith("Cpus_allowed_list:"):
                        found.append(_cpu_list(line.split(":", 1)[1]))
                        break
        except OSError:
            continue  # the thread ended while we looked
    return found


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for every worker of one sandbox."""

    device: str = "cpu"
    threads: int = field(default_factory=_default_threads)
    memory_bytes: int = 8 << 30  # address space on CPU; resident set (watchdog) everywhere
    cpu_seconds: int = 3600
    file_bytes: int = 1 << 30
    open_files: int = 1024
    landlock: bool = True
    drop_to_user: str = "nobody"
    startup_timeout_s: float = 180.0
    pin_cpus: bool = True  # every worker on the same measurement cores (see measurement_cpus)
    # Paths a worker may read besides _read_roots() (a model folder the worker loads), read-only.
    extra_read_roots: tuple[str, ...] = ()
    # What a worker serves: "module:Class" under runners/, constructed with device=...
    worker_handler: str = "runners.measure:ChildRunner"

    @property
    def cpus(self) -> list[int]:
        return measurement_cpus(self.threads) if self.pin_cpus else []


@dataclass(frozen=True)
class Reply:
    header: dict[str, Any]
    tensors: list[torch.Tensor]
    sent_ns: int
    received_ns: int


class Worker:
    """The parent's handle on one forked worker."""

    def __init__(self, sandbox: Sandbox, pid: int, sock: socket.socket, role: str, scratch: str) -> None:
        self.sandbox = sandbox
        self.pid = pid
        self.role = role
        self.scratch = scratch
        self._sock = sock
        self._closed = False
        self.failure: SandboxError | None = None

    @property
    def trusted(self) -> bool:
        return self.role != "candidate"

    def call(
        self,
        op: str,
        *,
        timeout: float,
        max_reply_bytes: int = 1 << 34,
        **fields: Any,
    ) -> Reply:
        """Send one request and wait for its reply; failures of the worker raise SandboxError."""
        if self.failure is not None:
            raise self.failure
        if self._closed:
            raise SandboxError("harness.error", f"worker {self.pid} is closed")
        deadline = time.monotonic() + timeout
        sent = time.perf_counter_ns()
        try:
            send_message(self._sock, {"op": op, **fields})
            header, tensors = recv_message(
                self._sock, deadline=deadline, max_payload=max_reply_bytes, on_wait=self._watchdog
            )
        except TimeoutError:
            self._fail("sandbox.timeout", f"no answer to {op!r} within {timeout:.0f} s")
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._fail_from_exit(op)
        except (ValueError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            self._fail("sandbox.protocol", f"malformed reply to {op!r}: {exc}")
        received = time.perf_counter_ns()
        if not header.get("ok"):
            error = header.get("error") if isinstance(header.get("error"), dict) else {}
            code = str(error.get("code", ""))
            if code not in _SELF_REPORTED_CODES and not (self.trusted and code == "harness.error"):
                code = "sandbox.candidate_exception" if not self.trusted else "harness.error"
            failure = SandboxError(code, str(error.get("message", ""))[:2000], str(error.get("detail", ""))[:8000])
            self.failure = failure
            raise failure
        return Reply(header=header, tensors=tensors, sent_ns=sent, received_ns=received)

    def _watchdog(self) -> None:
        rss = self.rss_bytes()
        if rss > self.sandbox.config.memory_bytes:
            self._fail("sandbox.memory_limit", f"resident memory {rss >> 20} MiB over the {self.sandbox.config.memory_bytes >> 20} MiB limit")
        cpu = self.cpu_ns() / 1e9
        if cpu > self.sandbox.config.cpu_seconds:
            self._fail("sandbox.cpu_limit", f"used {cpu:.0f} s CPU, over the {self.sandbox.config.cpu_seconds} s limit")

    def _fail(self, code: str, message: str) -> None:
        self.kill()
        self.failure = SandboxError(code, message, self.log_tail())
        raise self.failure

    def _fail_from_exit(self, op: str) -> None:
        status = self.sandbox._wait(self.pid, timeout=5.0)
        self._closed = True
        if status.get("signal") is not None:
            number = int(status["signal"])
            name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
            code = {signal.SIGXCPU: "sandbox.cpu_limit", signal.SIGXFSZ: "sandbox.crash"}.get(number, "sandbox.crash")
            message = f"worker died from {name} during {op!r}"
        elif status.get("exit_code") is not None:
            code, message = "sandbox.exit", f"worker exited with status {status['exit_code']} during {op!r}"
        else:
            self.kill()
            code, message = "sandbox.protocol", f"worker closed its channel during {op!r}"
        tail = self.log_tail()
        if code == "sandbox.crash" and ("MemoryError" in tail or "out of memory" in tail):
            code = "sandbox.memory_limit"
        self.failure = SandboxError(code, message, tail)
        raise self.failure

    def cpu_ns(self) -> int:
        """CPU time of the whole worker process (all threads, exited ones included), from the kernel."""
        return process_cpu_ns(self.pid)

    def runqueue_wait_ns(self) -> int | None:
        """Nanoseconds the worker's main thread has spent runnable but waiting for a core, from
        /proc/PID/schedstat (None where the kernel keeps no scheduler statistics)."""
        try:
            with open(f"/proc/{self.pid}/schedstat") as handle:
                return int(handle.read().split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def cpus_widened(self) -> list[int]:
        """CPUs outside the sandbox's measurement cores that a thread of this worker may now use
        (a candidate that widens its own mask would compute on the parent's core). Empty when
        the sandbox does not pin."""
        assigned = set(self.sandbox.config.cpus)
        if not assigned:
            return []
        extra: set[int] = set()
        for allowed in thread_affinities(self.pid):
            extra |= allowed - assigned
        return sorted(extra)

    def rss_bytes(self) -> int:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def log_tail(self, limit: int = 4000) -> str:
        try:
            with open(os.path.join(self.scratch, "worker.log"), "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - limit))
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        if not self._closed:
            self._closed = True
            self.sandbox._kill(self.pid)
            try:
                self._sock.close()
            except OSError:
                pass

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self._closed:
            return
        try:
            send_message(self._sock, {"op": "exit"})
        except OSError:
            pass
        status = self.sandbox._wait(self.pid, timeout=2.0)
        if status.get("running"):
            self.sandbox._kill(self.pid)
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass


class Sandbox:
    """A zygote plus its workers. Use as a context manager; `close()` kills everything it started."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._zygote: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._root: str | None = None
        self._workers: list[Worker] = []
        self._info: dict[str, Any] = {}
        self._finalizer: weakref.finalize | None = None

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def info(self) -> dict[str, Any]:
        """How workers are isolated on this machine (goes into results)."""
        self.start()
        return dict(self._info)

    def _plan(self) -> dict[str, Any]:
        plan: dict[str, Any] = {
            "user": None,
            "uid": None,
            "gid": None,
            "drop_capabilities": False,
            "landlock_abi": landlock_abi() if self.config.landlock else 0,
            "limits": {
                "memory_bytes": self.config.memory_bytes,
                "cpu_seconds": self.config.cpu_seconds,
                "file_bytes": self.config.file_bytes,
                "open_files": self.config.open_files,
            },
            "notes": [],
        }
        if os.geteuid() != 0:
            plan["user"] = pwd.getpwuid(os.geteuid()).pw_name
            plan["notes"].append("not started as root: workers keep the current uid")
            return plan
        needed = [
            os.path.realpath(sys.executable),
            os.path.join(os.path.dirname(os.__file__), "os.py"),
            torch.__file__,
            str(REPO_ROOT / "runners" / "__init__.py"),
        ]
        unreadable = [p for p in needed if not _readable_by_others(p)]
        try:
            user = pwd.getpwnam(self.config.drop_to_user)
        except KeyError:
            unreadable.append(f"(no user {self.config.drop_to_user!r})")
            user = None
        if user is not None and not unreadable:
            plan.update(user=user.pw_name, uid=user.pw_uid, gid=user.pw_gid)
        else:
            plan.update(user="root", drop_capabilities=True)
            plan["notes"].append(
                "workers stay uid 0 without capabilities because the interpreter is not readable by "
                f"{self.config.drop_to_user!r}: {', '.join(unreadable)}; install Python where other users can read it"
            )
        if not plan["landlock_abi"]:
            plan["notes"].append("Landlock unavailable: no filesystem, TCP or signal confinement beyond file permissions")
        return plan

    def start(self) -> None:
        if self._zygote is not None:
            return
        plan = self._plan()
        _remove_stale_roots()
        self._root = tempfile.mkdtemp(prefix=_ROOT_PREFIX)
        os.chmod(self._root, 0o711)  # workers of another uid must reach their own subdirectory
        Path(self._root, "owner.pid").write_text(str(os.getpid()))
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {
            "device": self.config.device,
            "threads": self.config.threads,
            "cpus": self.config.cpus,
            "extra_read_roots": [os.path.realpath(p) for p in self.config.extra_read_roots],
            "handler": self.config.worker_handler,
            "memory_bytes": self.config.memory_bytes,
            "cpu_seconds": self.config.cpu_seconds,
            "file_bytes": self.config.file_bytes,
            "open_files": self.config.open_files,
            "root": self._root,
            "plan": plan,
        }
        log = open(os.path.join(self._root, "zygote.log"), "ab")
        try:
            self._zygote = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from runners.sandbox import zygote_main; zygote_main(int(sys.argv[1]), sys.argv[2])",
                    str(child_end.fileno()),
                    json.dumps(config),
                ],
                pass_fds=(child_end.fileno(),),
                env=sandbox_environment(dict(os.environ), home=self._root, threads=self.config.threads),
                cwd=self._root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            child_end.close()
            log.close()
        self._control = parent_end
        self._finalizer = weakref.finalize(self, _cleanup, self._zygote, self._root)
        ready = self._request({"op": "hello"}, timeout=self.config.startup_timeout_s)
        self._info = {**plan, "zygote_pid": self._zygote.pid, "torch": ready.get("torch")}

    def _request(self, message: dict[str, Any], *, timeout: float, want_fd: bool = False) -> dict[str, Any]:
        assert self._control is not None
        self._control.sendall(json.dumps(message).encode())
        ready, _, _ = select.select([self._control], [], [], timeout)
        if not ready:
            raise SandboxError("harness.error", f"sandbox zygote did not answer {message['op']!r} in {timeout:.0f} s", self._zygote_log())
        data, fds, _, _ = socket.recv_fds(self._control, 1 << 16, 1)
        if not data:
            raise SandboxError("harness.error", "sandbox zygote exited", self._zygote_log())
        reply = json.loads(data)
        if want_fd:
            reply["fd"] = fds[0] if fds else None
        else:
            for fd in fds:
                os.close(fd)
        if not reply.get("ok"):
            raise SandboxError("harness.error", f"sandbox zygote refused {message['op']!r}: {reply.get('error')}")
        return reply

    def _zygote_log(self) -> str:
        if self._root is None:
            return ""
        try:
            return Path(self._root, "zygote.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def spawn(self, role: str) -> Worker:
        """Fork a fresh worker. role: 'baseline', 'reference' (trusted code) or 'candidate'."""
        if role not in ("baseline", "reference", "candidate"):
            raise ValueError(f"unknown worker role {role!r}")
        self.start()
        reply = self._request({"op": "spawn", "role": role}, timeout=60.0, want_fd=True)
        if reply.get("fd") is None:
            raise SandboxError("harness.error", "sandbox zygote sent no channel for the new worker")
        worker = Worker(self, int(reply["pid"]), socket.socket(fileno=reply["fd"]), role, reply["scratch"])
        self._workers.append(worker)
        # The worker locks itself down before answering; its first reply proves it is ready.
        worker.call("ping", timeout=60.0)
        return worker

    def strays(self) -> list[int]:
        """Kill and report processes that workers left behind (forks, daemons)."""
        if self._control is None:
            return []
        return list(self._request({"op": "strays"}, timeout=10.0).get("killed", []))

    def _wait(self, pid: int, *, timeout: float) -> dict[str, Any]:
        try:
            return self._request({"op": "wait", "pid": pid, "timeout": timeout}, timeout=timeout + 10.0)
        except (SandboxError, OSError):
            return {}

    def _kill(self, pid: int) -> None:
        try:
            self._request({"op": "kill", "pid": pid}, timeout=10.0)
        except (SandboxError, OSError):
            pass

    def close(self) -> None:
        for worker in self._workers:
            worker.kill()
        self._workers.clear()
        if self._control is not None:
            try:
                self._request({"op": "exit"}, timeout=10.0)
            except (SandboxError, OSError, json.JSONDecodeError):
                pass
            self._control.close()
            self._control = None
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._zygote = None


_ROOT_PREFIX = "dyno-sandbox-"


def _remove_stale_roots() -> None:
    """Scratch roots whose owning process died without closing its sandbox (killed, OOM)."""
    base = Path(tempfile.gettempdir())
    for root in base.glob(_ROOT_PREFIX + "*"):
        try:
            owner = int(Path(root, "owner.pid").read_text())
        except (OSError, ValueError):
            continue  # not ours to judge (no owner recorded)
        if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(root, ignore_errors=True)


def _cleanup(zygote: subprocess.Popen[bytes], root: str) -> None:
    if zygote.poll() is None:
        try:
            os.killpg(zygote.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            zygote.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Child side: the zygote and the worker bootstrap. Nothing here runs in the parent.


def zygote_main(control_fd: int, config_json: str) -> None:
    config = json.loads(config_json)
    control = socket.socket(fileno=control_fd)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    # Orphans of workers (double forks) are re-parented here, where `strays` can find them.
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    import runners.measure  # noqa: F401  (torch, the suite and the worker code, loaded once)
    import importlib

    # The module workers serve from (config `handler`), also loaded once before any fork.
    importlib.import_module(str(config.get("handler") or "runners.measure:ChildRunner").partition(":")[0])

    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        pass
    import gc

    # Everything imported so far is permanent: collections in workers stay short.
    gc.collect()
    gc.freeze()
    workers: dict[int, str] = {}
    serial = 0
    while True:
        data = control.recv(1 << 16)
        if not data:
            _kill_all(workers)
            return
        message = json.loads(data)
        op = message.get("op")
        reply: dict[str, Any] = {"ok": True}
        fds: list[int] = []
        try:
            if op == "hello":
                reply["torch"] = torch.__version__
            elif op == "spawn":
                serial += 1
                scratch = os.path.join(config["root"], f"{message['role']}-{serial}")
                pid, parent_end = _fork_worker(config, message["role"], scratch, control)
                workers[pid] = scratch
                reply.update(pid=pid, scratch=scratch)
                fds = [parent_end.fileno()]
                socket.send_fds(control, [json.dumps(reply).encode()], fds)
                parent_end.close()
                continue
            elif op == "wait":
                reply.update(_wait_status(int(message["pid"]), float(message.get("timeout", 0.0)), workers))
            elif op == "kill":
                _kill_tree(int(message["pid"]))
                _wait_status(int(message["pid"]), 2.0, workers)
            elif op == "strays":
                reply["killed"] = _kill_strays(workers)
            elif op == "exit":
                _kill_all(workers)
                control.send(json.dumps(reply).encode())
                return
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as exc:  # report to the parent instead of dying silently
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        control.send(json.dumps(reply).encode())


def _fork_worker(config: dict[str, Any], role: str, scratch: str, control: socket.socket) -> tuple[int, socket.socket]:
    plan = config["plan"]
    os.makedirs(scratch, mode=0o700)
    for sub in ("tmp", "cache", "triton", "inductor"):
        os.makedirs(os.path.join(scratch, sub), mode=0o700)
    if plan.get("uid") is not None:
        for dirpath, _, _ in os.walk(scratch):
            os.chown(dirpath, plan["uid"], plan["gid"])
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            control.close()
            parent_end.close()
            _worker_main(child_end, config, role, scratch)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    child_end.close()
    return pid, parent_end


def _wait_status(pid: int, timeout: float, workers: dict[int, str]) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            workers.pop(pid, None)
            return {"gone": True}
        if done:
            workers.pop(pid, None)
            if os.WIFSIGNALED(status):
                return {"signal": os.WTERMSIG(status)}
            return {"exit_code": os.WEXITSTATUS(status)}
        if time.monotonic() >= deadline:
            return {"running": True}
        time.sleep(0.01)


def _process_table() -> dict[int, int]:
    """pid -> parent pid for every visible process."""
    table: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(entry)] = int(fields[1])
    return table


def _descendants(root: int, table: dict[int, int]) -> list[int]:
    found: list[int] = []
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in table.items() if ppid == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def _kill_tree(pid: int) -> None:
    for victim in [pid, *_descendants(pid, _process_table())]:
        try:
            os.kill(victim, signal.SIGKILL)
        except OSError:
            pass


def _kill_strays(workers: dict[int, str]) -> list[int]:
    """Every descendant of the zygote that is not a live worker is a stray; kill and reap them."""
    table = _process_table()
    mine = _descendants(os.getpid(), table)
    strays = [pid for pid in mine if pid not in workers]
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in strays:
        if table.get(pid) == os.getpid():
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return strays


def _kill_all(workers: dict[int, str]) -> None:
    for pid in list(workers):
        _kill_tree(pid)
        _wait_status(pid, 2.0, workers)
    _kill_strays(workers)


def _worker_main(sock: socket.socket, config: dict[str, Any], role: str, scratch: str) -> None:
    """Lock this freshly forked process down, then serve the parent's requests."""
    os.setsid()
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    log = os.open(os.path.join(scratch, "worker.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    keep = {0, 1, 2, sock.fileno()}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    import faulthandler

    faulthandler.enable()
    os.chdir(scratch)
    os.environ.update(_home_environment(scratch))
    plan = config["plan"]
    # No RLIMIT_CPU: it arms a process CPU timer, and while one runs the kernel reports the
    # process's CPU clock only at tick granularity, which blinds the parent's CPU accounting.
    # The parent's watchdog enforces `cpu_seconds` instead.
    limits = [
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, int(config["file_bytes"])),
        (resource.RLIMIT_NOFILE, int(config["open_files"])),
    ]
    if not str(config["device"]).startswith("cuda"):
        # CUDA reserves far more address space than it uses, so on GPUs the parent's
        # resident-set watchdog is the memory limit instead.
        limits.append((resource.RLIMIT_AS, int(config["memory_bytes"])))
    if plan.get("uid") is not None:
        # Counts every process and thread of the sandbox user; only meaningful for a dedicated uid.
        limits.append((resource.RLIMIT_NPROC, 4096))
    for which, value in limits:
        resource.setrlimit(which, (value, value))
    if plan.get("uid") is not None:
        os.setgroups([])
        os.setgid(plan["gid"])
        os.setuid(plan["uid"])
    elif plan.get("drop_capabilities"):
        _drop_capabilities()
    _prctl(_PR_SET_DUMPABLE, 0)
    abi = int(plan.get("landlock_abi") or 0)
    if abi:
        _apply_landlock(abi=abi, writable=[scratch, "/dev"], readable=_read_roots() + list(config.get("extra_read_roots", [])), listable=[str(REPO_ROOT)])
    # Like timeit: no automatic collections, whose pauses would land at random inside or around
    # timed calls. The worker collects explicitly while preparing, outside any window.
    import gc

    gc.disable()
    if config.get("cpus"):
        # Before the intra-op pool starts, so its threads inherit the mask.
        os.sched_setaffinity(0, [int(c) for c in config["cpus"]])
    torch.set_num_threads(int(config["threads"]))
    # Start the intra-op thread pool now, so threads a call starts are the candidate's.
    torch.ones(1 << 16).mul(2).sum()
    torch.ones(64, 64) @ torch.ones(64, 64)
    import importlib

    module_name, _, class_name = str(config.get("handler") or "runners.measure:ChildRunner").partition(":")
    handler = getattr(importlib.import_module(module_name), class_name)
    serve(sock, handler(device=str(config["device"])))


def serve(sock: socket.socket, handler: Any) -> None:
    """Answer requests until the parent says exit or goes away."""
    while True:
        try:
            header, tensors = recv_message(sock)
        except (EOFError, OSError):
            return
        op = header.get("op")
        if op == "exit":
            return
        out: Sequence[torch.Tensor] = ()
        try:
            reply, out = handler.handle(str(op), header, tensors)
            reply = {"ok": True, **reply}
        except WorkerFault as fault:
            reply = {"ok": False, "error": {"code": fault.code, "message": fault.message, "detail": fault.detail}}
        except BaseException as exc:  # a harness bug in the worker, reported rather than hanging
            reply = {
                "ok": False,
                "error": {"code": "harness.error", "message": f"{type(exc).__name__}: {exc}", "detail": traceback.format_exc()},
            }
        try:
            send_message(sock, reply, out)
        except OSError:
            return
