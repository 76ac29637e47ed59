"""The zygote (imports torch once, forks one worker per request) and the worker bootstrap that
locks a fork down and serves the parent. Runs inside the sandbox; workers run untrusted code."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time
import traceback
from typing import Any, Sequence

import torch

from runners.sandbox.environment import home_environment
from runners.sandbox.lockdown import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, lock_down, prctl, worker_plan
from runners.sandbox.procfs import descendants, process_table
from runners.sandbox.wire import WorkerFault, recv_message, send_message

DEFAULT_HANDLER = "runners.audit.worker:KernelWorker"


def zygote_main(control_fd: int, config_json: str) -> None:
    config = json.loads(config_json)
    control = socket.socket(fileno=control_fd)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # Orphans of workers (double forks) are re-parented here, where `strays` can find them.
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    import importlib

    import runners.measure  # noqa: F401  (torch, the suite and the worker code, loaded once)

    # The module workers serve from (config `handler`), also loaded once before any fork.
    importlib.import_module(str(config.get("handler") or DEFAULT_HANDLER).partition(":")[0])
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
        try:
            if op == "hello":
                reply.update(torch=torch.__version__, pid=os.getpid())
            elif op == "spawn":
                serial += 1
                scratch = os.path.join(config["root"], f"{message['role']}-{serial}")
                pid, parent_end = _fork_worker(config, scratch, control, str(message["role"]))
                workers[pid] = scratch
                reply.update(pid=pid, scratch=scratch)
                socket.send_fds(control, [json.dumps(reply).encode()], [parent_end.fileno()])
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


def _fork_worker(config: dict[str, Any], scratch: str, control: socket.socket, role: str) -> tuple[int, socket.socket]:
    config = {**config, "plan": worker_plan(config["plan"], role)}
    plan = config["plan"]
    os.makedirs(scratch, mode=0o700)
    for sub in ("tmp", "cache", "triton", "inductor"):
        os.makedirs(os.path.join(scratch, sub), mode=0o700)
    # Opened before the directory changes hands: the zygote keeps no right to override permissions.
    log = os.open(os.path.join(scratch, "worker.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    if plan.get("uid") is not None:
        # Children first: once the scratch directory belongs to the worker's uid, the zygote (no
        # CAP_DAC_OVERRIDE) can no longer look inside it.
        for path in [*(os.path.join(scratch, sub) for sub in ("tmp", "cache", "triton", "inductor")), os.path.join(scratch, "worker.log"), scratch]:
            os.chown(path, plan["uid"], plan["gid"])
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            control.close()
            parent_end.close()
            _worker_main(child_end, config, scratch, log)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    child_end.close()
    os.close(log)
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


def _kill_tree(pid: int) -> None:
    for victim in [pid, *descendants(pid, process_table())]:
        try:
            os.kill(victim, signal.SIGKILL)
        except OSError:
            pass


def _kill_strays(workers: dict[int, str]) -> list[int]:
    """Every descendant of the zygote that is not a live worker is a stray; kill and reap them."""
    table = process_table()
    strays = [pid for pid in descendants(os.getpid(), table) if pid not in workers]
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


def _worker_main(sock: socket.socket, config: dict[str, Any], scratch: str, log: int) -> None:
    """Wait until the parent has put this fork in its cgroup, lock it down, then serve."""
    os.setsid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
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
    header, _ = recv_message(sock)
    if header.get("op") != "start":
        raise RuntimeError(f"expected 'start' from the parent, got {header.get('op')!r}")
    os.environ.update(home_environment(scratch))
    os.environ.pop("PWD", None)  # bubblewrap's, the sandbox root; the worker lives in its scratch
    lock_down(config, scratch)
    os.chdir(scratch)  # only the sandbox user may enter it
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

    module_name, _, class_name = str(config.get("handler") or DEFAULT_HANDLER).partition(":")
    handler = getattr(importlib.import_module(module_name), class_name)
    serve(sock, handler(device=str(config["device"])))


# How long a worker polls for its next request, when its handler expects one at once
# (`next_request_soon`), before it sleeps in recv.
AWAIT_POLL_S = 0.05


def await_request(sock: socket.socket, limit_s: float) -> None:
    """Poll the socket until a request is readable or `limit_s` passes, instead of sleeping in recv.

    Between the calls of a whole-model sample the parent's next request follows its reply at once,
    and the time a worker takes to wake from a blocking recv is inside the parent's window. A
    worker running the candidate's code could poll on its own (a red team's spinning receive read
    decode 1.5-5.5% faster than the same model waking from recv, 2026-12-05), so every worker polls
    alike: the wake-up is nobody's lever."""
    end = time.monotonic() + limit_s
    while not select.select([sock], [], [], 0)[0] and time.monotonic() < end:
        pass


def serve(sock: socket.socket, handler: Any) -> None:
    """Answer requests until the parent says exit or goes away."""
    while True:
        if getattr(handler, "next_request_soon", False):
            await_request(sock, AWAIT_POLL_S)
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
