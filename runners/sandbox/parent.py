"""The parent's side of the sandbox: configuration, starting the zygote under bubblewrap, one
cgroup per worker, and the Worker handle (calls, CPU of the whole tree, freezing). Trusted."""

from __future__ import annotations

import grp
import json
import os
import pwd
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from runners.sandbox import cgroups, seccomp
from runners.sandbox.bwrap import bwrap_argv, bwrap_path
from runners.sandbox.environment import REPO_ROOT, sandbox_environment
from runners.sandbox.lockdown import landlock_abi
from runners.sandbox.procfs import (
    default_threads,
    descendants,
    host_pid,
    measurement_cpus,
    process_cpu_ns,
    process_table,
    status_field,
    thread_affinities,
)
from runners.sandbox.wire import SELF_REPORTED_CODES, SandboxError, recv_message, send_message
from runners.sandbox.zygote import DEFAULT_HANDLER

_ROOT_PREFIX = "dyno-sandbox-"
_SHARED_PREFIX = "dyno-shared-"
_NAMESPACES = {"pid": "pid_namespace", "net": "net_namespace", "mnt": "mount_namespace", "ipc": "ipc_namespace", "user": "user_namespace"}
# Signal scoping (a candidate cannot stop the baseline worker, which runs as the same uid) arrived
# in Landlock ABI 6.
_LANDLOCK_NEEDED = 6


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for every worker of one sandbox."""

    device: str = "cpu"
    threads: int = field(default_factory=default_threads)
    memory_bytes: int = 8 << 30  # per worker's process tree (cgroup); address space on CPU too
    cpu_seconds: int = 3600
    file_bytes: int = 1 << 30
    open_files: int = 1024
    max_tasks: int = 512  # processes and threads of one worker's tree (cgroup pids.max)
    landlock: bool = True
    bubblewrap: bool = True
    drop_to_user: str = "nobody"
    startup_timeout_s: float = 180.0
    pin_cpus: bool = True  # every worker on the same measurement cores (see measurement_cpus)
    # Paths a worker may read besides environment.read_roots() (a model folder it loads), read-only.
    extra_read_roots: tuple[str, ...] = ()
    # What a worker serves: "module:Class" under runners/, constructed with device=...
    worker_handler: str = DEFAULT_HANDLER
    # Refuse to start unless every protection a billable audit needs is on (see Sandbox.info).
    require_complete: bool = False

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
    """The parent's handle on one forked worker and every process it starts. `pid` is the
    worker's pid as the parent sees it (outside the sandbox's PID namespace)."""

    def __init__(self, sandbox: Sandbox, pid: int, ns_pid: int, sock: socket.socket, role: str, scratch: str, cgroup: cgroups.WorkerCgroup | None) -> None:
        self.sandbox = sandbox
        self.pid = pid
        self.role = role
        self.scratch = scratch
        self.failure: SandboxError | None = None
        self._ns_pid = ns_pid
        self._sock = sock
        self._cgroup = cgroup
        self._closed = False
        self._mem_fd: int | None = None
        self._schedstat_fd: int | None = None
        self.calls_tid: int | None = None  # the thread that runs the calls (KernelWorker's lane); the main thread when None
        self._code_sent = False  # a `load` was sent: what the worker says from then on may be the candidate's
        self.frozen = False  # a request to a frozen worker thaws it first

    @property
    def trusted(self) -> bool:
        return self.role != "candidate"

    def call(self, op: str, *, timeout: float, max_reply_bytes: int = 1 << 34, tensors: Sequence[torch.Tensor] = (),
             **fields: Any) -> Reply:
        """Send one request (JSON fields, and raw tensors) and wait for its reply; failures of the
        worker raise SandboxError. A frozen worker is thawed first."""
        sent = self.send(op, tensors=tensors, **fields)
        reply = self.receive(op, sent_ns=sent, deadline=time.monotonic() + timeout, timeout=timeout, max_reply_bytes=max_reply_bytes)
        if op == "bind" and not self._code_sent:
            # The thread that runs the calls, as the harness started it before any candidate code:
            # its scheduler statistics give the run-queue wait that samples discount.
            self.adopt_calls_thread(reply.header.get("calls_tid"))
        return reply

    def send(self, op: str, *, tensors: Sequence[torch.Tensor] = (), **fields: Any) -> int:
        """The request half of `call`: returns when it was sent (perf_counter ns)."""
        if self.failure is not None:
            raise self.failure
        if self._closed:
            raise SandboxError("harness.error", f"worker {self.pid} is closed")
        if self.frozen:
            self.thaw()
        if op == "load":
            self._code_sent = True
        sent = time.perf_counter_ns()
        try:
            send_message(self._sock, {"op": op, **fields}, tensors)
        except (BrokenPipeError, ConnectionResetError):
            self._fail_from_exit(op)
        return sent

    def reply_ready(self) -> bool:
        """Whether the worker has started to answer (or closed its end): a poll, never blocks."""
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def receive(self, op: str, *, sent_ns: int, deadline: float, timeout: float, max_reply_bytes: int = 1 << 34) -> Reply:
        """The reply half of `call`."""
        try:
            header, tensors = recv_message(self._sock, deadline=deadline, max_payload=max_reply_bytes, on_wait=self._watchdog)
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
            if code not in SELF_REPORTED_CODES and not (self.trusted and code == "harness.error"):
                code = "sandbox.candidate_exception" if not self.trusted else "harness.error"
            failure = SandboxError(code, str(error.get("message", ""))[:2000], str(error.get("detail", ""))[:8000])
            self.failure = failure
            raise failure
        return Reply(header=header, tensors=tensors, sent_ns=sent_ns, received_ns=received)

    def check_limits(self, op: str, deadline: float, timeout: float) -> None:
        """While the parent waits on something other than the socket: the same limits as `call`."""
        if time.monotonic() > deadline:
            self._fail("sandbox.timeout", f"no answer to {op!r} within {timeout:.0f} s")
        self._watchdog()

    def peek(self, address: int, nbytes: int) -> bytes:
        """`nbytes` of the running worker's memory at `address`, through a file kept open (one
        system call: the stepped samples read the worker's "done" record this way)."""
        if self._mem_fd is None:
            try:
                self._mem_fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise SandboxError("harness.error", f"cannot open the memory of worker {self.pid}: {exc}") from exc
        try:
            return os.pread(self._mem_fd, nbytes, address)
        except (OSError, OverflowError, ValueError):
            return b""

    def peek_scattered(self, address: int, nbytes: int, *, chunk: int = 1 << 16) -> bytes:
        """Like `peek`, but the span is read in chunks taken in an order drawn from a secret source,
        so a worker still writing part of the span cannot stay ahead of the read by writing in
        the order a front-to-back read would follow. Empty when any chunk is unreadable."""
        if nbytes <= chunk:
            return self.peek(address, nbytes)
        data = bytearray(nbytes)
        starts = list(range(0, nbytes, chunk))
        secrets.SystemRandom().shuffle(starts)
        for start in starts:
            part = self.peek(address + start, min(chunk, nbytes - start))
            if len(part) != min(chunk, nbytes - start):
                return b""
            data[start:start + len(part)] = part
        return bytes(data)

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
        status = self.sandbox._wait(self._ns_pid, timeout=5.0)
        oom = self._cgroup is not None and self._cgroup.oom_killed()
        if status.get("signal") is not None:
            number = int(status["signal"])
            name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
            code = {signal.SIGXCPU: "sandbox.cpu_limit"}.get(number, "sandbox.crash")
            message = f"worker died from {name} during {op!r}"
        elif status.get("exit_code") is not None:
            code, message = "sandbox.exit", f"worker exited with status {status['exit_code']} during {op!r}"
        else:
            code, message = "sandbox.protocol", f"worker closed its channel during {op!r}"
        tail = self.log_tail()
        self.kill()
        if code == "sandbox.crash" and (oom or "MemoryError" in tail or "out of memory" in tail):
            code = "sandbox.memory_limit"
        self.failure = SandboxError(code, message, tail)
        raise self.failure

    # -- the whole process tree (the worker's cgroup; the worker alone where the host has none)

    def processes(self) -> list[int]:
        """Every process of the worker's tree, as pids of the parent's namespace."""
        if self._cgroup is not None:
            return self._cgroup.pids()
        if not os.path.exists(f"/proc/{self.pid}"):
            return []
        return sorted([self.pid, *descendants(self.pid, process_table())])

    def extra_processes(self) -> list[int]:
        return [pid for pid in self.processes() if pid != self.pid]

    def cpu_ns(self) -> int:
        """CPU time of the worker's whole tree (every thread of every process, exited ones
        included), as the kernel has booked it: exact while the tree waits or is frozen, up to a
        scheduler tick behind for a thread running at the read; the worker process alone without
        cgroups."""
        if self._cgroup is not None:
            return self._cgroup.cpu_ns()
        return process_cpu_ns(self.pid)

    def freeze(self) -> None:
        """Stop every process of the tree; returns once the kernel reports them frozen."""
        self._set_frozen(True)

    def thaw(self) -> None:
        self._set_frozen(False)

    def _set_frozen(self, frozen: bool) -> None:
        """Freezing is preceded by SIGSTOP to every process of the tree, and thawing followed by
        SIGCONT. The cgroup v1 freezer (and v2's on some kernels) stops a thread asleep with a
        timeout where it is, with the sleep's timer still armed: the timer fires on the measurement
        core, inside the next arm's window, from a tree that is supposed to do nothing. A stop
        signal wakes every interruptible sleeper, which leaves its sleep and so cancels its timer
        (the sleep resumes, to the same deadline, after SIGCONT), and the wake-ups are CPU of the
        tree, between its samples, where the hidden-work figure counts it. A red team's 440
        sleeping threads slowed the trusted arms by 17-27% through the freezer alone (2026-12-05)."""
        if self._cgroup is None or "freezer" not in self._cgroup.dirs:
            raise SandboxError("harness.error", "this host cannot freeze a worker (no freezer cgroup; see Sandbox.info()['missing'])")
        try:
            if frozen:
                self._signal_tree(signal.SIGSTOP)
            self._cgroup.set_frozen(frozen)
            if not frozen:
                self._signal_tree(signal.SIGCONT)
            self.frozen = frozen
        except (OSError, TimeoutError) as exc:
            raise SandboxError("harness.error", f"could not {'freeze' if frozen else 'thaw'} worker {self.pid}: {exc}") from exc

    def _signal_tree(self, signum: int) -> None:
        assert self._cgroup is not None
        for pid in self._cgroup.pids():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def read_memory(self, address: int, nbytes: int) -> bytes:
        """`nbytes` of the worker's memory at `address` (meant for a frozen worker)."""
        try:
            fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY)
        except OSError as exc:
            raise SandboxError("harness.error", f"cannot open the memory of worker {self.pid}: {exc}") from exc
        try:
            data = os.pread(fd, nbytes, address)
        except (OSError, OverflowError, ValueError) as exc:
            raise SandboxError("sandbox.protocol", f"worker {self.pid} named an unreadable address {address:#x} (+{nbytes} B): {exc}") from exc
        finally:
            os.close(fd)
        if len(data) != nbytes:
            raise SandboxError("sandbox.protocol", f"worker {self.pid}: only {len(data)} of {nbytes} B readable at {address:#x}")
        return data

    def adopt_calls_thread(self, tid: Any) -> bool:
        """Read scheduler statistics from thread `tid` from now on: the thread the worker says runs
        its calls, which must be a thread of this worker named `dyno-calls`. Once only, and meant
        before any candidate code is loaded (the parent's `bind`); True when adopted."""
        if self.calls_tid is not None or not isinstance(tid, int) or tid <= 0:
            return False
        # The worker names its thread in its own PID namespace; find it in ours (NSpid's last field).
        found = None
        try:
            for entry in os.listdir(f"/proc/{self.pid}/task"):
                task = Path(f"/proc/{self.pid}/task/{entry}")
                status = (task / "status").read_text()
                nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [entry])
                if nspid and int(nspid[-1]) == tid and (task / "comm").read_text().strip() == "dyno-calls":
                    found = int(entry)
                    break
        except (OSError, ValueError):
            return False
        if found is None or found == self.pid:
            return False
        self.calls_tid = found
        if self._schedstat_fd is not None:
            os.close(self._schedstat_fd)
            self._schedstat_fd = None
        return True

    def _main_thread_schedstat(self) -> tuple[int, int] | None:
        """(CPU ns, run-queue wait ns) of the thread that runs the calls (the worker's call lane, or
        its main thread), from /proc/PID[/task/TID]/schedstat through a file kept open (one system
        call, cheap enough between the calls of a stepped sample). Current while the thread is not
        running; None where the kernel keeps no scheduler statistics or the thread is gone."""
        try:
            if self._schedstat_fd is None:
                path = f"/proc/{self.pid}/task/{self.calls_tid}/schedstat" if self.calls_tid else f"/proc/{self.pid}/schedstat"
                self._schedstat_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            fields = os.pread(self._schedstat_fd, 128, 0).split()
            return int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            return None

    def main_thread_cpu_ns(self) -> int:
        """CPU time of the worker's main thread alone (0 without scheduler statistics)."""
        stat = self._main_thread_schedstat()
        return stat[0] if stat else 0

    def runqueue_wait_ns(self) -> int | None:
        """Nanoseconds the worker's main thread has spent runnable but waiting for a core
        (None without scheduler statistics)."""
        stat = self._main_thread_schedstat()
        return stat[1] if stat else None

    def cpus_widened(self) -> list[int]:
        """CPUs outside the sandbox's measurement cores that a thread of any process of this
        worker's tree may now use. Empty when the sandbox does not pin (and, with a cpuset
        cgroup, always: the kernel keeps every mask inside it; this checks that it did)."""
        assigned = set(self.sandbox.config.cpus)
        if not assigned:
            return []
        extra: set[int] = set()
        for pid in self.processes() or [self.pid]:
            for allowed in thread_affinities(pid):
                extra |= allowed - assigned
        return sorted(extra)

    def rss_bytes(self) -> int:
        values = status_field(self.pid, "VmRSS")
        return int(values[0]) * 1024 if values else 0

    def log_tail(self, limit: int = 4000) -> str:
        try:
            with open(os.path.join(self.scratch, "worker.log"), "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - limit))
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    def kill_extra_processes(self) -> list[int]:
        """SIGKILL every process of the tree but the worker itself; returns their pids."""
        extra = self.extra_processes()
        for pid in extra:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return extra

    def kill(self) -> None:
        """Kill every process of the tree and remove its cgroup."""
        if self._closed:
            return
        self._closed = True
        if self._cgroup is not None:
            self._cgroup.kill_all()
        self.sandbox._kill(self._ns_pid)
        self._release()

    def close(self) -> None:
        """Ask the worker to exit; kill it (and whatever it started) if it does not."""
        if self._closed:
            return
        if self.frozen:
            try:
                self.thaw()
            except SandboxError:
                pass
        try:
            send_message(self._sock, {"op": "exit"})
        except OSError:
            pass
        status = self.sandbox._wait(self._ns_pid, timeout=2.0)
        if status.get("running"):
            self.sandbox._kill(self._ns_pid)
        self._closed = True
        self._release()

    def _release(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
        for name in ("_mem_fd", "_schedstat_fd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
        if self._cgroup is not None:
            self._cgroup.remove()


class Sandbox:
    """A zygote (under bubblewrap where installed) plus its workers. Use as a context manager;
    `close()` kills everything it started and removes its cgroups and directories."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._zygote: subprocess.Popen[bytes] | None = None
        self._zygote_pid: int | None = None  # the zygote itself, in the parent's namespace
        self._control: socket.socket | None = None
        self._root: str | None = None
        self._shared: str | None = None
        self._cgroups: cgroups.SandboxCgroups | None = None
        self._workers: list[Worker] = []
        self._info: dict[str, Any] = {}
        self._finalizer: weakref.finalize | None = None

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def shared_dir(self) -> str:
        """A root-owned directory the parent writes inputs into; workers see it read-only at the same path."""
        self.start()
        assert self._shared is not None
        return self._shared

    def info(self) -> dict[str, Any]:
        """How workers are isolated on this machine (goes into results)."""
        self.start()
        return json.loads(json.dumps(self._info))

    def _plan(self) -> dict[str, Any]:
        plan: dict[str, Any] = {
            "user": None,
            "uid": None,
            "gid": None,
            "drop_capabilities": False,
            "bubblewrap": bwrap_path() if self.config.bubblewrap else None,
            "landlock_abi": landlock_abi() if self.config.landlock else 0,
            "seccomp": seccomp.supported(),
            "limits": {
                "memory_bytes": self.config.memory_bytes,
                "cpu_seconds": self.config.cpu_seconds,
                "file_bytes": self.config.file_bytes,
                "open_files": self.config.open_files,
                "max_tasks": self.config.max_tasks,
            },
            "notes": [],
        }
        if not plan["bubblewrap"]:
            plan["notes"].append("bubblewrap: " + ("switched off in SandboxConfig" if not self.config.bubblewrap else "bwrap is not installed (apt-get install bubblewrap)") + "; workers share the host's namespaces and see its files, sockets and processes")
        if not plan["seccomp"]:
            plan["notes"].append(f"seccomp: no syscall table for {os.uname().machine}")
        if plan["landlock_abi"] < _LANDLOCK_NEEDED:
            plan["notes"].append(f"landlock: kernel ABI {plan['landlock_abi']}, {_LANDLOCK_NEEDED} needed to stop a candidate signalling the baseline worker")
        if os.geteuid() != 0:
            plan["user"] = pwd.getpwuid(os.geteuid()).pw_name
            if not plan["bubblewrap"]:
                plan["notes"].append("not started as root: workers keep the current uid")
            return plan
        try:
            user = pwd.getpwnam(self.config.drop_to_user)
        except KeyError:
            user = None
        # Under bubblewrap the interpreter's directories are bound on their own, so no parent
        # directory (such as a mode-700 /root) stands between the sandbox user and them.
        unreadable = [] if plan["bubblewrap"] else [p for p in _needed_files() if not _readable_by_others(p)]
        if user is not None and user.pw_uid != 0 and not unreadable:
            plan.update(user=user.pw_name, uid=user.pw_uid, gid=user.pw_gid)
            # Candidates run as a uid of their own: the kernel lets a process renice, reschedule
            # (SCHED_IDLE), re-limit (prlimit) or trace only processes of its own uid, so a
            # candidate sharing the trusted workers' uid could demote the baseline it is measured
            # against (a red team set the trusted workers to SCHED_IDLE, 2026-12-05).
            spare = _spare_uid(user.pw_uid)
            if spare is not None:
                plan.update(candidate_uid=spare, candidate_gid=spare)
            else:
                plan["notes"].append(f"separate_uids: no unused uid below {user.pw_uid} for candidates; they share the trusted workers' uid")
        else:
            plan.update(user="root", drop_capabilities=True)
            why = f"no user {self.config.drop_to_user!r}" if user is None else f"the interpreter is not readable by {self.config.drop_to_user!r}: {', '.join(unreadable)}"
            plan["notes"].append(f"unprivileged_uid: workers stay uid 0 without capabilities because {why}")
        return plan

    def start(self) -> None:
        if self._zygote is not None:
            return
        plan = self._plan()
        _remove_stale_roots()
        version, bases, cgroup_notes = cgroups.discover()
        if version:
            cgroups.remove_stale(version, bases)
        plan["notes"] += cgroup_notes
        self._root = tempfile.mkdtemp(prefix=_ROOT_PREFIX)
        os.chmod(self._root, 0o711)  # workers of another uid must reach their own subdirectory
        Path(self._root, "owner.pid").write_text(str(os.getpid()))
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self._shared = tempfile.mkdtemp(prefix=f"{_SHARED_PREFIX}{os.getpid()}-", dir=shm)
        os.chmod(self._shared, 0o755)
        if version:
            name = f"{cgroups.PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
            try:
                self._cgroups = cgroups.SandboxCgroups(version, bases, name, cgroups.Limits(self.config.cpus, self.config.memory_bytes, self.config.max_tasks))
            except OSError as exc:
                plan["notes"].append(f"cgroups: could not create {name} ({exc})")
                cgroups.remove_tree(version, {c: b / name for c, b in bases.items()})
        self._finalizer = weakref.finalize(self, _cleanup, None, self._root, self._shared, self._cgroups)
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
            "shared_dir": self._shared,
            "plan": plan,
        }
        command = [sys.executable, "-c", "import sys; from runners.sandbox.zygote import zygote_main; zygote_main(int(sys.argv[1]), sys.argv[2])", str(child_end.fileno()), json.dumps(config)]
        if plan["bubblewrap"]:
            command = bwrap_argv(bwrap=plan["bubblewrap"], device=self.config.device, extra_read_roots=config["extra_read_roots"], root=self._root, shared_dir=self._shared, as_root=os.geteuid() == 0) + command
        log = open(os.path.join(self._root, "zygote.log"), "ab")
        try:
            self._zygote = subprocess.Popen(
                command,
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
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _cleanup, self._zygote, self._root, self._shared, self._cgroups)
        ready = self._request({"op": "hello"}, timeout=self.config.startup_timeout_s)
        self._zygote_pid = host_pid(int(ready["pid"]), under=self._zygote.pid) if plan["bubblewrap"] else self._zygote.pid
        self._info = {**plan, "zygote_pid": self._zygote_pid, "torch": ready.get("torch"), **self._protections(plan)}
        if self.config.require_complete and not self._info["complete"]:
            missing = "; ".join(self._info["missing"])
            self.close()
            raise SandboxError("harness.error", f"the sandbox lacks protections a billable audit needs: {missing}")

    def _protections(self, plan: dict[str, Any]) -> dict[str, Any]:
        """Each protection, checked from outside where it can be (namespaces of the zygote), and
        what is missing for a billable audit, in words."""
        found: dict[str, Any] = {"bubblewrap": bool(plan["bubblewrap"])}
        for ns, key in _NAMESPACES.items():
            try:
                found[key] = self._zygote_pid is not None and os.readlink(f"/proc/{self._zygote_pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
            except OSError:
                found[key] = False
        found["unprivileged_uid"] = (plan["uid"] not in (None, 0)) or (os.geteuid() != 0)
        found["separate_uids"] = plan.get("uid") not in (None, 0) and plan.get("candidate_uid") not in (None, 0, plan.get("uid"))
        found["seccomp"] = bool(plan["seccomp"])
        found["landlock_abi"] = int(plan["landlock_abi"])
        dirs = self._cgroups.dirs if self._cgroups is not None else {}
        for controller in cgroups.CONTROLLERS:
            found[f"cgroup_{controller}"] = controller in dirs
        accounts_tree = found["cgroup_cpu"] and found["cgroup_cpuset"] and found["cgroup_freezer"]
        required = [k for k in found if k not in ("user_namespace", "landlock_abi")]
        missing = [line for line in plan["notes"] if not line.startswith("not started as root")]
        for key in required:
            if not found[key] and not any(line.startswith(key.split("_namespace")[0].removeprefix("cgroup_")) or key in line for line in missing):
                missing.append(f"{key}: not in effect")
        complete = all(found[k] for k in required) and found["landlock_abi"] >= _LANDLOCK_NEEDED
        return {"protections": found, "accounts_tree": accounts_tree, "complete": complete, "missing": missing if not complete else []}

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
        """Fork a fresh worker in a cgroup of its own. role: 'baseline', 'reference' (trusted
        code) or 'candidate'."""
        if role not in ("baseline", "reference", "candidate"):
            raise ValueError(f"unknown worker role {role!r}")
        self.start()
        assert self._zygote is not None
        reply = self._request({"op": "spawn", "role": role}, timeout=60.0, want_fd=True)
        if reply.get("fd") is None:
            raise SandboxError("harness.error", "sandbox zygote sent no channel for the new worker")
        sock = socket.socket(fileno=reply["fd"])
        ns_pid = int(reply["pid"])
        pid = host_pid(ns_pid, under=self._zygote.pid) if self._info.get("bubblewrap") else ns_pid
        cgroup = None
        try:
            if pid is None:
                raise SandboxError("harness.error", f"worker {ns_pid} of the sandbox has no pid outside it")
            if self._cgroups is not None:
                cgroup = self._cgroups.worker(f"{role}-{pid}")
                cgroup.enter(pid)
        except (OSError, SandboxError) as exc:
            self._kill(ns_pid)
            sock.close()
            if cgroup is not None:
                cgroup.remove()
            raise exc if isinstance(exc, SandboxError) else SandboxError("harness.error", f"could not put worker {pid} in its cgroup: {exc}") from exc
        worker = Worker(self, pid, ns_pid, sock, role, reply["scratch"], cgroup)
        self._workers.append(worker)
        # Only now, inside its cgroup, does the worker lock itself down; its first reply proves it did.
        send_message(sock, {"op": "start"})
        worker.call("ping", timeout=60.0)
        self._check_locked_down(worker)
        return worker

    def _check_locked_down(self, worker: Worker) -> None:
        """Read from outside what the kernel says about the new worker: its uids and seccomp mode."""
        uids = [int(u) for u in status_field(worker.pid, "Uid")]
        problems = []
        if self._info["protections"]["unprivileged_uid"] and (not uids or 0 in uids):
            problems.append(f"runs with uids {uids}")
        info = self._info
        if info.get("uid") is not None and info.get("candidate_uid") is not None:
            expected = info["candidate_uid"] if worker.role == "candidate" else info["uid"]
            if uids and set(uids) != {expected}:
                problems.append(f"runs with uids {uids}, not the {worker.role} uid {expected}")
        if self._info["protections"]["seccomp"] and status_field(worker.pid, "Seccomp") != ["2"]:
            problems.append("has no seccomp filter")
        if status_field(worker.pid, "NoNewPrivs") != ["1"]:
            problems.append("may gain privileges")
        if problems:
            worker.kill()
            raise SandboxError("harness.error", f"worker {worker.pid} is not locked down: {', '.join(problems)}", worker.log_tail())

    def strays(self) -> list[int]:
        """Kill and report processes that workers left behind (forks, daemons): every process of
        a live worker's cgroup but the worker, and any other descendant of the zygote."""
        if self._control is None:
            return []
        killed: list[int] = []
        for worker in self._workers:
            if not worker._closed and worker._cgroup is not None:
                killed += worker.kill_extra_processes()
        reaped = list(self._request({"op": "strays"}, timeout=10.0).get("killed", []))
        return sorted(killed) if self._cgroups is not None else reaped

    def _wait(self, ns_pid: int, *, timeout: float) -> dict[str, Any]:
        try:
            return self._request({"op": "wait", "pid": ns_pid, "timeout": timeout}, timeout=timeout + 10.0)
        except (SandboxError, OSError):
            return {}

    def _kill(self, ns_pid: int) -> None:
        if self._control is None:
            return
        try:
            self._request({"op": "kill", "pid": ns_pid}, timeout=10.0)
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


def _needed_files() -> list[str]:
    return [
        os.path.realpath(sys.executable),
        os.path.join(os.path.dirname(os.__file__), "os.py"),
        torch.__file__,
        str(REPO_ROOT / "runners" / "__init__.py"),
    ]


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


def _spare_uid(trusted: int) -> int | None:
    """An unprivileged uid no account uses, just below the trusted workers' (nobody's 65534:
    65533), for candidate workers."""
    for uid in range(trusted - 1, max(trusted - 64, 1000), -1):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            try:
                grp.getgrgid(uid)
            except KeyError:
                return uid
    return None


def _remove_stale_roots() -> None:
    """Scratch roots and shared directories whose owning process died without closing its
    sandbox (killed, OOM)."""
    for root in Path(tempfile.gettempdir()).glob(_ROOT_PREFIX + "*"):
        try:
            owner = int(Path(root, "owner.pid").read_text())
        except (OSError, ValueError):
            continue  # not ours to judge (no owner recorded)
        if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(root, ignore_errors=True)
    for base in {"/dev/shm", tempfile.gettempdir()}:
        for shared in Path(base).glob(_SHARED_PREFIX + "*"):
            try:
                owner = int(shared.name.removeprefix(_SHARED_PREFIX).split("-")[0])
            except ValueError:
                continue
            if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
                shutil.rmtree(shared, ignore_errors=True)


def _cleanup(zygote: subprocess.Popen[bytes] | None, root: str, shared: str, groups: cgroups.SandboxCgroups | None) -> None:
    if zygote is not None and zygote.poll() is None:
        try:
            os.killpg(zygote.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            zygote.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    if groups is not None:
        groups.remove()
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(shared, ignore_errors=True)
