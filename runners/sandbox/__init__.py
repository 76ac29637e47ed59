"""Sandboxed execution: a zygote that forks one isolated worker per candidate, and the parent's
handles on them. Trusted parent side in parent.py; what runs in the sandbox in zygote.py and lockdown.py.

Why a zygote: importing torch costs ~2 s, and the optimizer's search evaluates many candidates.
The zygote imports torch once (running nothing parallel and touching no GPU, so forking is
safe); each worker is a fresh fork that locks itself down before it loads any candidate code.
The zygote runs under bubblewrap (new PID, mount, network, IPC, UTS and cgroup namespaces, a
read-only view of exactly what workers read); each worker gets a cgroup of its own from the
parent, drops to an unprivileged uid, and applies Landlock and seccomp to itself.
"""

from runners.sandbox.environment import ENV_PASSTHROUGH, MALLOC_ENVIRONMENT, REPO_ROOT, sandbox_environment
from runners.sandbox.lockdown import landlock_abi
from runners.sandbox.parent import Reply, Sandbox, SandboxConfig, Worker
from runners.sandbox.procfs import cpu_list as _cpu_list
from runners.sandbox.procfs import measurement_cpus, process_cpu_ns, thread_affinities
from runners.sandbox.wire import MAX_HEADER_BYTES, WIRE_DTYPES, SandboxError, WorkerFault, recv_message, send_message
from runners.sandbox.zygote import serve, zygote_main

__all__ = [
    "ENV_PASSTHROUGH",
    "MALLOC_ENVIRONMENT",
    "MAX_HEADER_BYTES",
    "REPO_ROOT",
    "WIRE_DTYPES",
    "Reply",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "Worker",
    "WorkerFault",
    "_cpu_list",
    "landlock_abi",
    "measurement_cpus",
    "process_cpu_ns",
    "recv_message",
    "sandbox_environment",
    "send_message",
    "serve",
    "thread_affinities",
    "zygote_main",
]
