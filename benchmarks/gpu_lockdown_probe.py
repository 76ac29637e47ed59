"""Which step of a worker's lock-down keeps CUDA from starting (GPU machine only).

    python3 benchmarks/gpu_lockdown_probe.py [--json FILE]

Forks one child per variant from a process that has imported torch and triton (as the zygote
has) but not started CUDA; each child applies its part of `runners.sandbox.lockdown.lock_down`
and then starts CUDA and allocates one tensor. Prints one line per variant and, with --json,
writes them. Landlock variants that add a read root tell which path the driver needs.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import torch  # noqa: E402

try:
    import triton  # noqa: E402,F401
except ImportError:
    pass

from runners.sandbox import lockdown, seccomp  # noqa: E402
from runners.sandbox.environment import WRITABLE_DEVICES, gpu_device_nodes, read_roots  # noqa: E402


def _limits() -> None:
    for which, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, 1 << 30), (resource.RLIMIT_NOFILE, 1024)):
        resource.setrlimit(which, (value, value))


def _uid() -> None:
    user = pwd.getpwnam("nobody")
    resource.setrlimit(resource.RLIMIT_NPROC, (4096, 4096))
    lockdown.become(user.pw_uid, user.pw_gid)


def _landlock(scratch: str, *, extra_read: tuple[str, ...] = (), extra_write: tuple[str, ...] = (), **handled: bool) -> Callable[[], None]:
    def apply() -> None:
        lockdown.apply_landlock(
            abi=lockdown.landlock_abi(),
            writable=[scratch, *WRITABLE_DEVICES, *gpu_device_nodes("cuda"), *extra_write],
            readable=[*read_roots(device="cuda"), "/proc", *extra_read],
            listable=[str(ROOT)],
            **handled,
        )
    return apply


def _child(steps: list[Callable[[], None]], scratch: str) -> dict[str, Any]:
    os.environ.update(HOME=scratch, TMPDIR=scratch, XDG_CACHE_HOME=scratch, TRITON_CACHE_DIR=scratch)
    for step in steps:
        step()
    os.chdir(scratch)
    began = time.monotonic()
    torch.cuda.init()
    x = torch.ones(1 << 20, device="cuda")
    total = float(x.sum().item())
    return {"ok": total == float(1 << 20), "seconds": round(time.monotonic() - began, 2)}


def run(name: str, steps: list[Callable[[], None]], scratch: str, timeout: float = 40.0) -> dict[str, Any]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            result = _child(steps, scratch)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status = -1
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    result = json.loads(data) if data else {"ok": False, "error": f"no report (wait status {status})"}
    result["variant"] = name
    print(f"{name:40s} {'ok' if result.get('ok') else 'FAILED'} {result.get('error', '')}", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", default="", help="comma-separated variant names")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="dyno-probe-")
    os.chmod(scratch, 0o777)
    os.chmod(os.path.dirname(scratch), os.stat(os.path.dirname(scratch)).st_mode | 0o011)
    land = _landlock(scratch)
    dumpable = lambda: lockdown.prctl(lockdown.PR_SET_DUMPABLE, 0)  # noqa: E731
    variants: list[tuple[str, list[Callable[[], None]]]] = [
        ("nothing", []),
        ("limits", [_limits]),
        ("uid nobody", [_uid]),
        ("not dumpable", [dumpable]),
        ("seccomp", [seccomp.install]),
        ("landlock", [land]),
        ("landlock read /", [_landlock(scratch, extra_read=("/",))]),
        ("landlock read / write /dev", [_landlock(scratch, extra_read=("/",), extra_write=("/dev",))]),
        ("landlock write /dev/shm", [_landlock(scratch, extra_write=("/dev/shm",))]),
    ]
    variants += [
        ("landlock files only", [_landlock(scratch, handle_net=False, scope=False)]),
        ("landlock network only", [_landlock(scratch, handle_fs=False, scope=False)]),
        ("landlock scopes only", [_landlock(scratch, handle_fs=False, handle_net=False)]),
        ("landlock write /", [_landlock(scratch, extra_read=("/",), extra_write=("/",))]),
        ("landlock write /proc", [_landlock(scratch, extra_write=("/proc",))]),
        ("landlock write /proc/self", [_landlock(scratch, extra_write=("/proc/self",))]),
        ("landlock write /proc/thread-self", [_landlock(scratch, extra_write=("/proc/thread-self",))]),
        ("landlock write /proc/driver", [_landlock(scratch, extra_write=("/proc/driver",))]),
        ("landlock write /proc/sys", [_landlock(scratch, extra_write=("/proc/sys",))]),
        ("landlock write /sys", [_landlock(scratch, extra_write=("/sys",))]),
        ("landlock write /tmp", [_landlock(scratch, extra_write=("/tmp",))]),
    ]
    tops = sorted({f"/{p}" for p in os.listdir("/")} - {"/proc", "/usr", "/lib", "/lib64", "/bin", "/sbin"})
    variants += [(f"landlock read +{top}", [_landlock(scratch, extra_read=(top,))]) for top in tops]
    variants += [("everything", [_limits, _uid, dumpable, land, seccomp.install])]
    variants += [("everything with own proc writable", [_limits, _uid, dumpable, _landlock(scratch, extra_write=tuple(lockdown.own_proc_for("cuda"))), seccomp.install])]
    if args.only:
        variants = [v for v in variants if v[0] in args.only.split(",")]
    results = [run(name, steps, scratch) for name, steps in variants]
    facts = {"dev": sorted(os.listdir("/dev")), "nvidia_nodes": {p: [oct(os.stat(p).st_mode), os.stat(p).st_uid, os.stat(p).st_gid] for p in gpu_device_nodes("cuda")},
             "ld_library_path": os.environ.get("LD_LIBRARY_PATH"), "landlock_abi": lockdown.landlock_abi(),
             "read_roots": read_roots(device="cuda")}
    print(json.dumps(facts))
    if args.json:
        args.json.write_text(json.dumps({"variants": results, "facts": facts}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
