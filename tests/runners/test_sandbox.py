"""The sandbox: what candidate code can see and touch, and how the parent survives it.

Each test loads a probe candidate (tests/runners/cheats/probe_*.py) into a real worker under
real bubblewrap and cgroups, and asserts on what the probe reports it could do."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import pytest

from runners.sandbox import ENV_PASSTHROUGH, MALLOC_ENVIRONMENT, REPO_ROOT, Sandbox, SandboxConfig, SandboxError, WorkerFault, landlock_abi, process_cpu_ns, sandbox_environment
from runners.sandbox import cgroups
from runners.sandbox.procfs import status_field

CHEATS = Path(__file__).resolve().parent / "cheats"
SECRETS = {
    "DATABASE_URL": "postgres://dyno:hunter2@db/dyno",
    "DYNO_SECRET_KEY": "django-insecure-canary",
    "DYNO_SIGNING_KEY_PATH": "/etc/dyno/signing.key",
    "CELERY_BROKER_URL": "redis://:pw@broker/0",
    "DYNO_RUNNER_TOKEN": "dyno_runner_canary",
    "OPENAI_API_KEY": "sk-canary",
    "AWS_SECRET_ACCESS_KEY": "canary",
}
HAS_BWRAP = shutil.which("bwrap") is not None
HAS_CGROUPS = cgroups.discover()[0] != 0
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap is not installed (test_it_runs_workers_under_bubblewrap fails for it)")
needs_cgroups = pytest.mark.skipif(not HAS_CGROUPS, reason="no writable cgroup hierarchy on this host")


class ProbeWorker:
    """The worker these tests serve: loads a probe as a module (an exception at import is its
    report) and calls its report(). Independent of the audit's worker, so these tests test the
    sandbox alone."""

    def __init__(self, device: str) -> None:
        self.module: types.ModuleType | None = None

    def handle(self, op: str, header: dict[str, Any], tensors: list) -> tuple[dict[str, Any], list]:
        if op == "ping":
            return {"pid": os.getpid()}, []
        if op == "load":
            module = types.ModuleType("probe")
            try:
                exec(compile(header["source"], "probe", "exec"), module.__dict__)
            except BaseException as exc:
                raise WorkerFault("sandbox.import_error", f"{type(exc).__name__}: {exc}") from None
            self.module = module
            return {}, []
        if op == "report":
            assert self.module is not None
            return {"report": self.module.report()}, []
        raise ValueError(f"unknown op {op!r}")


def _config(**overrides: Any) -> SandboxConfig:
    return SandboxConfig(threads=1, worker_handler="tests.runners.test_sandbox:ProbeWorker", extra_read_roots=(str(REPO_ROOT / "tests"),), **overrides)


@pytest.fixture(scope="module")
def sandbox():
    previous = {name: os.environ.get(name) for name in SECRETS}
    os.environ.update(SECRETS)  # the parent holds secrets, as a Celery worker does
    try:
        with Sandbox(_config()) as box:
            yield box
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _source(name: str, **tokens: Any) -> str:
    source = (CHEATS / name).read_text()
    for key, value in tokens.items():
        source = source.replace(f"__{key}__", str(value))
    return source


def _load(worker, name: str, **tokens: Any) -> None:
    worker.call("load", timeout=30, source=_source(name, **tokens))


def _probe(sandbox: Sandbox, name: str, **tokens: Any) -> dict:
    """Load a probe candidate; it raises at import with a JSON report of what it could do."""
    worker = sandbox.spawn("candidate")
    try:
        with pytest.raises(SandboxError) as caught:
            _load(worker, name, **tokens)
    finally:
        worker.close()
    assert caught.value.code == "sandbox.import_error", caught.value
    match = re.search(r"PROBE-REPORT (.*)$", caught.value.message)
    assert match, caught.value.message
    return json.loads(match.group(1))


def test_it_builds_the_child_environment_from_an_allow_list():
    env = sandbox_environment({**SECRETS, "PATH": "/usr/bin", "TRITON_INTERPRET": "1", "MY_TOKEN": "x"}, home="/s", threads=2)
    assert not set(SECRETS) & set(env) and "MY_TOKEN" not in env
    assert env["PATH"] == "/usr/bin" and env["TRITON_INTERPRET"] == "1" and env["HOME"] == "/s"
    assert env["OMP_NUM_THREADS"] == "2" and env["PYTHONPATH"] == str(REPO_ROOT)


def test_it_runs_workers_under_bubblewrap():
    # Fails rather than skips: CI installs bubblewrap (scripts/services.sh), and a runner
    # without it produces results that do not bill.
    assert HAS_BWRAP, "bwrap is not installed: apt-get install -y bubblewrap (scripts/services.sh)"


@needs_bwrap
@needs_cgroups
def test_it_reports_every_protection_and_is_complete_here(sandbox):
    info = sandbox.info()
    assert info["landlock_abi"] == landlock_abi()
    assert info["limits"]["memory_bytes"] == SandboxConfig().memory_bytes
    protections = info["protections"]
    assert set(protections) == {
        "bubblewrap", "pid_namespace", "net_namespace", "mount_namespace", "ipc_namespace", "user_namespace",
        "unprivileged_uid", "separate_uids", "seccomp", "landlock_abi", "cgroup_cpu", "cgroup_cpuset", "cgroup_freezer",
        "cgroup_memory", "cgroup_pids",
    }
    assert info["accounts_tree"] is True
    assert info["complete"] is True, info["missing"]
    assert info["missing"] == []


def test_it_says_what_is_missing_and_refuses_when_completeness_is_required():
    with Sandbox(_config(bubblewrap=False)) as box:
        info = box.info()
        assert info["complete"] is False and info["protections"]["bubblewrap"] is False
        assert any(line.startswith("bubblewrap") for line in info["missing"])
    with pytest.raises(SandboxError) as caught:
        Sandbox(_config(bubblewrap=False, require_complete=True)).start()
    assert caught.value.code == "harness.error" and "bubblewrap" in caught.value.message


def test_it_shows_candidates_no_secret_from_the_parents_environment(sandbox):
    names = set(_probe(sandbox, "probe_env_secrets.py"))
    assert not names & set(SECRETS)
    forced = {"HOME", "TMPDIR", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "PYTHONPATH"}
    assert forced <= names
    assert names <= set(ENV_PASSTHROUGH) | forced | {
        "PYTHONNOUSERSITE", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "OMP_NUM_THREADS",
        "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS", "LC_CTYPE", *MALLOC_ENVIRONMENT,
    }


def test_it_lets_candidates_write_only_inside_their_scratch_directory(sandbox):
    report = _probe(sandbox, "probe_write_outside.py")
    assert report["scratch"] == "written"
    assert set(report[k] for k in ("repo", "package", "tmp", "sandbox_root")) <= {"PermissionError", "OSError"}, report
    assert not (REPO_ROOT / "dyno_sandbox_escape.txt").exists()
    assert not (REPO_ROOT / "runners" / "dyno_sandbox_escape.py").exists()
    assert not Path("/tmp/dyno_sandbox_escape.txt").exists()


def test_it_keeps_files_outside_the_allowed_roots_unreadable(sandbox):
    secret = Path("/tmp/dyno-probe-secret")
    secret.write_text("SECRET-CONTENT")
    secret.chmod(0o644)  # readable by anyone as far as file permissions go
    try:
        report = _probe(sandbox, "probe_read_secret.py")
    finally:
        secret.unlink()
    assert "read" not in report["secret"] and not report["/tmp"].startswith("listed 1"), report


@needs_bwrap
def test_it_keeps_root_only_files_unreadable(sandbox):
    planted = Path(sandbox.shared_dir, "root-only")
    planted.write_text("ROOT-SECRET")
    planted.chmod(0o600)
    try:
        report = _probe(sandbox, "probe_root_files.py", ROOT_ONLY=repr(str(planted)))
    finally:
        planted.unlink()
    assert report == {"/etc/shadow": report["/etc/shadow"], "/etc/gshadow": report["/etc/gshadow"], str(planted): "PermissionError"}
    assert not any(value.startswith("read") for value in report.values()), report


@needs_bwrap
def test_it_blocks_tcp_and_udp_to_the_host(sandbox):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        udp.bind(("127.0.0.1", 0))
        report = _probe(sandbox, "probe_network.py", TCP_PORT=tcp.getsockname()[1], UDP_PORT=udp.getsockname()[1])
        tcp.setblocking(False)
        udp.setblocking(False)
        with pytest.raises(BlockingIOError):
            tcp.accept()
        with pytest.raises(BlockingIOError):
            udp.recvfrom(64)
    assert report == {"tcp": "PermissionError", "udp": "PermissionError", "inet6": "PermissionError"}


@needs_bwrap
def test_it_blocks_unix_sockets_of_the_host(sandbox):
    listeners = []
    paths = [os.path.join(tempfile.mkdtemp(prefix="dyno-probe-"), "listener.sock")]
    if os.path.isdir("/run") and os.access("/run", os.W_OK):
        paths.append(f"/run/dyno-probe-{os.getpid()}.sock")
    abstract = f"\0dyno-probe-{os.getpid()}"
    try:
        for path in [*paths, abstract]:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen()
            listener.setblocking(False)
            listeners.append(listener)
        report = _probe(sandbox, "probe_unix_sockets.py", SOCKET_PATHS=repr([*paths, "/run/postgresql/.s.PGSQL.5432"]), ABSTRACT=repr(abstract))
        for listener in listeners:
            with pytest.raises(BlockingIOError):
                listener.accept()
    finally:
        for listener in listeners:
            listener.close()
        for path in paths:
            Path(path).unlink(missing_ok=True)
        shutil.rmtree(os.path.dirname(paths[0]), ignore_errors=True)
    assert report.pop("/run") in ("FileNotFoundError", [])
    assert "connected" not in report.values(), report


@needs_bwrap
def test_it_refuses_netlink_packet_and_raw_sockets(sandbox):
    assert _probe(sandbox, "probe_socket_families.py") == {"netlink": "PermissionError", "packet": "PermissionError", "inet_raw": "PermissionError"}


@needs_bwrap
def test_it_gives_workers_no_raw_devices(sandbox):
    report = _probe(sandbox, "probe_devices.py")
    listing = report.pop("listing")
    assert report.pop("present") == [], report  # bubblewrap's /dev has none of them
    assert listing == "PermissionError" or not {"mem", "kmem", "port", "kmsg", "vda", "sda"} & set(listing), listing
    assert "read" not in report.values(), report


@needs_bwrap
def test_it_hides_the_harness_process_and_host_processes(sandbox):
    report = _probe(sandbox, "probe_proc.py", PARENT_PID=os.getpid())
    own_cmdline = Path("/proc/self/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
    for name in ("cmdline", "environ"):
        assert "DYNO_SECRET_KEY" not in report[name] and "pytest" not in report[name], report[name]
    listed = report["listed"]
    assert len(listed) < 10, listed  # bubblewrap's init, the zygote, a few workers
    assert not any("pytest" in cmdline or own_cmdline[:60] in cmdline for cmdline in listed.values()), listed


@needs_bwrap
def test_it_gives_setuid_programs_no_privileges(sandbox):
    report = _probe(sandbox, "probe_setuid.py")
    passwd = report["/usr/bin/passwd"]
    assert passwd.get("returncode") != 0, passwd  # root may view root's password status; nobody may not
    assert report["/usr/bin/su"].get("output", "").strip() != "0", report


@needs_bwrap
def test_it_lets_nothing_persist_between_workers_or_sandboxes(sandbox):
    written = _probe(sandbox, "probe_persist.py", MODE="write")
    assert set(written.values()) <= {"PermissionError", "FileNotFoundError"}, written
    assert _probe(sandbox, "probe_persist.py", MODE="look") == {"/dev/shm/dyno-probe-persist": False, "/tmp/dyno-probe-persist": False}
    with Sandbox(_config()) as fresh:
        assert _probe(fresh, "probe_persist.py", MODE="look") == {"/dev/shm/dyno-probe-persist": False, "/tmp/dyno-probe-persist": False}
    assert not Path("/dev/shm/dyno-probe-persist").exists() and not Path("/tmp/dyno-probe-persist").exists()


@pytest.mark.skipif(landlock_abi() < 1, reason="needs Landlock; without it /proc/<pid>/environ is guarded by uid only")
def test_it_hides_other_processes_environments(sandbox):
    baseline = sandbox.spawn("baseline")
    try:
        report = _probe(sandbox, "probe_parent_environ.py")
    finally:
        baseline.close()
    assert report["leaked"] is False and report["readable"] == []


@pytest.mark.skipif(landlock_abi() < 6, reason="signal scoping arrived in Landlock ABI 6")
def test_it_stops_candidates_from_signalling_the_baseline_worker(sandbox):
    baseline = sandbox.spawn("baseline")
    try:
        report = _probe(sandbox, "probe_signals.py")
        assert baseline.call("ping", timeout=10).header["pid"]
    finally:
        baseline.close()
    assert report["reachable"] == []


@needs_bwrap
def test_it_runs_workers_under_an_unprivileged_kernel_uid(sandbox):
    worker = sandbox.spawn("candidate")
    try:
        status = Path(f"/proc/{worker.pid}/status").read_text()
        uids = re.search(r"^Uid:\s+(.*)$", status, re.M).group(1).split()
        caps = re.search(r"^CapBnd:\s+(\w+)$", status, re.M).group(1)
    finally:
        worker.close()
    # As root the sandbox drops to nobody (65534) for trusted workers and to a uid of their own for
    # candidates (65533 where no account holds it).
    assert uids == ["65533"] * 4 if os.geteuid() == 0 else "0" not in uids
    assert int(caps, 16) == 0


def test_a_candidate_cannot_renice_reschedule_relimit_or_signal_the_trusted_workers(sandbox):
    baseline = sandbox.spawn("baseline")
    try:
        report = _probe(sandbox, "probe_other_workers.py")
        trusted_uid = int(status_field(baseline.pid, "Uid")[0])
        assert trusted_uid != 0 and report["me"] not in (0, trusted_uid)
        # It sees the baseline worker (its uid is the trusted one) and can touch none of it.
        assert trusted_uid in {process["uid"] for process in report["seen"]}, report
        assert report["allowed"] == {"setpriority": [], "sched_setscheduler": [], "prlimit": [], "kill": []}, report
        assert baseline.call("ping", timeout=10.0) is not None
        assert int(Path(f"/proc/{baseline.pid}/stat").read_text().rsplit(")", 1)[1].split()[16]) == 0  # nice unchanged
    finally:
        baseline.close()


@needs_bwrap
def test_a_candidate_reads_no_per_core_counters_of_the_machine(sandbox):
    report = _probe(sandbox, "probe_machine_counters.py")
    # Masked with /dev/null, which Landlock then refuses to open (EACCES), or absent on this kernel:
    # either way nothing to read (the host's /proc/interrupts here is about 2 KiB).
    for path in ("/proc/interrupts", "/proc/softirqs", "/proc/stat", "/proc/schedstat"):
        assert report[path] == 0 or str(report[path]).startswith("error"), report
    assert report["cpu_count"] and report["cpu_count"] >= 1  # the runtime still finds its cores


def test_it_refuses_ptrace_namespaces_inet6_kernel_timers_and_rescheduling_by_seccomp(sandbox):
    assert _probe(sandbox, "probe_seccomp.py") == {
        "ptrace": 1, "unshare": 1, "inet6": 1, "timer_create": 1, "timerfd_create": 1, "setitimer": 1,
        "sched_setscheduler": 1, "setpriority": 1}


@needs_cgroups
def test_it_counts_a_forked_helpers_cpu(sandbox):
    worker = sandbox.spawn("candidate")
    try:
        _load(worker, "probe_forked_spin.py")
        tree, own = worker.cpu_ns(), process_cpu_ns(worker.pid)
        worker.call("report", timeout=30)
        assert worker.cpu_ns() - tree >= 0.25e9
        assert process_cpu_ns(worker.pid) - own < 0.1e9  # what the worker's own threads show
    finally:
        worker.close()


@needs_cgroups
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core outside the measurement cores")
def test_it_keeps_a_forked_helper_on_the_measurement_cores(sandbox):
    outside = min(set(os.sched_getaffinity(0)) - set(sandbox.config.cpus))
    worker = sandbox.spawn("candidate")
    try:
        _load(worker, "probe_forked_affinity.py", OUTSIDE_CORE=outside)
        report = worker.call("report", timeout=10).header["report"]
        assert outside not in report["mask"], report
        assert len(worker.extra_processes()) == 1 and worker.cpus_widened() == []
        assert sandbox.strays() == worker.extra_processes() or sandbox.strays() == []
    finally:
        worker.close()


@pytest.fixture
def spinning(sandbox):
    worker = sandbox.spawn("candidate")
    try:
        _load(worker, "probe_spin_thread.py")
        yield worker
    finally:
        worker.kill()


@needs_cgroups
def test_it_freezes_and_thaws_a_spinning_worker(spinning):
    spinning.freeze()
    frozen = spinning.cpu_ns()
    time.sleep(0.2)
    assert spinning.cpu_ns() - frozen < 5e6
    spinning.thaw()
    thawed = spinning.cpu_ns()
    time.sleep(0.2)
    assert spinning.cpu_ns() - thawed > 0.1e9


@needs_cgroups
def test_it_reads_a_frozen_workers_memory(spinning):
    where = spinning.call("report", timeout=10).header["report"]
    spinning.freeze()
    assert spinning.read_memory(where["address"], where["size"]) == b"DYNO-KNOWN-BUFFER-0123456789\0"
    with pytest.raises(SandboxError) as caught:
        spinning.read_memory(8, 16)
    assert caught.value.code == "sandbox.protocol"


@needs_cgroups
def test_it_removes_every_process_and_cgroup_when_a_worker_is_killed(sandbox):
    worker = sandbox.spawn("candidate")
    _load(worker, "probe_forked_affinity.py", OUTSIDE_CORE=min(os.sched_getaffinity(0)))
    processes = worker.processes()
    dirs = list(worker._cgroup.dirs.values())
    assert len(processes) == 2
    worker.kill()
    time.sleep(0.05)
    assert not any(Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3] for pid in processes)
    assert not any(path.exists() for path in dirs)


def test_it_survives_a_worker_that_dies_and_keeps_serving_new_ones(sandbox):
    worker = sandbox.spawn("candidate")
    with pytest.raises(SandboxError) as caught:
        worker.call("load", timeout=30, source="import os\nos._exit(9)\n")
    assert caught.value.code == "sandbox.exit" and "9" in caught.value.message
    fresh = sandbox.spawn("candidate")
    fresh.call("load", timeout=30, source="def report():\n    return 1\n")
    assert fresh.call("report", timeout=10).header["report"] == 1
    fresh.close()


def test_it_keeps_only_the_group_that_guards_a_gpu_device_file(monkeypatch):
    """A driver installed with a device-file group (mode 0660) needs that group in the worker; a
    world-usable node (0666, what the H200 host had) needs none, and nothing else is kept."""
    import stat as stat_module

    from runners.sandbox import lockdown

    modes = {"/dev/nvidia0": (0o660, 44), "/dev/nvidiactl": (0o666, 0), "/dev/nvidia-caps": (0o755, 0)}

    def fake_stat(path, *args, **kwargs):
        mode, gid = modes[path]
        kind = stat_module.S_IFDIR if path.endswith("caps") else stat_module.S_IFCHR
        return types.SimpleNamespace(st_mode=kind | mode, st_gid=gid, st_uid=0)

    monkeypatch.setattr(lockdown.os, "stat", fake_stat)
    assert lockdown.device_groups(list(modes)) == [44]
    modes["/dev/nvidia0"] = (0o666, 44)
    assert lockdown.device_groups(list(modes)) == []


def test_it_lets_a_cuda_worker_write_only_under_its_own_proc_directory():
    """The CUDA driver writes under the process's own /proc/<pid> as it starts (cuInit failed
    with error 304 without it on an H200); CPU workers get no /proc write at all."""
    from runners.sandbox import lockdown

    assert lockdown.own_proc_for("cpu") == []
    assert lockdown.own_proc_for("cuda:0") == ["/proc/self"]
