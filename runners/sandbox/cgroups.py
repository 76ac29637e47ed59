"""Control groups for workers: one per worker, made by the parent as root, holding every process
the worker starts (CPU accounting, cores, freezing, memory, process count). Trusted: parent only."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("cpu", "cpuset", "freezer", "memory", "pids")  # "cpu": cpuacct on v1, cpu.stat on v2
_V1_NAMES = {"cpu": "cpuacct", "cpuset": "cpuset", "freezer": "freezer", "memory": "memory", "pids": "pids"}
PREFIX = "dyno-"


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _read(path: Path) -> str:
    with open(path) as handle:
        return handle.read()


def _own_paths() -> dict[str, str]:
    """This process's cgroup per v1 controller name, and "" for the v2 hierarchy."""
    paths: dict[str, str] = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            paths[name] = path
    return paths


def discover() -> tuple[int, dict[str, Path], list[str]]:
    """(cgroup version, controller -> directory new cgroups go under, notes on what is missing).
    v1 where its controllers are mounted writable, else v2; only this process's own cgroup (or
    its v2 equivalent) is used, so a harness confined by its host stays inside its limits."""
    notes: list[str] = []
    try:
        mounts = [line.split() for line in _read(Path("/proc/self/mounts")).splitlines()]
        own = _own_paths()
    except OSError as exc:
        return 0, {}, [f"cgroups: cannot read /proc ({exc})"]
    v1: dict[str, Path] = {}
    v2_root: Path | None = None
    for _, mountpoint, fstype, options, *_ in mounts:
        if fstype == "cgroup":
            for controller, name in _V1_NAMES.items():
                if name in options.split(",") and name in own:
                    v1[controller] = Path(mountpoint) / own[name].lstrip("/")
        elif fstype == "cgroup2" and "" in own:
            v2_root = Path(mountpoint) / own[""].lstrip("/")
    v1 = {c: p for c, p in v1.items() if os.access(p, os.W_OK)}
    if v1:
        for controller in CONTROLLERS:
            if controller not in v1:
                notes.append(f"cgroup_{controller}: no writable cgroup v1 {_V1_NAMES[controller]} hierarchy")
        return 1, v1, notes
    if v2_root is None or not os.access(v2_root, os.W_OK):
        return 0, {}, ["cgroups: no writable cgroup v1 or v2 hierarchy (run the harness as root, or delegate a cgroup to it)"]
    found = {"cpu": v2_root, "freezer": v2_root}  # cpu.stat and cgroup.freeze are core files
    available = set(_read(v2_root / "cgroup.controllers").split())
    for controller in ("cpuset", "memory", "pids"):
        if controller in available:
            try:
                _write(v2_root / "cgroup.subtree_control", f"+{controller}")
                found[controller] = v2_root
                continue
            except OSError as exc:
                notes.append(f"cgroup_{controller}: cannot enable it below {v2_root} ({exc.strerror}; a cgroup v2 parent that holds processes cannot)")
        else:
            notes.append(f"cgroup_{controller}: not available in {v2_root}")
    return 2, found, notes


@dataclass
class Limits:
    cpus: list[int]  # empty: whatever the parent cgroup allows
    memory_bytes: int
    max_tasks: int


class WorkerCgroup:
    """One worker's cgroup in every hierarchy found (v1: a directory per controller)."""

    def __init__(self, version: int, dirs: dict[str, Path]) -> None:
        self.version = version
        self.dirs = dirs

    def _any(self) -> Path:
        return self.dirs.get("freezer") or self.dirs.get("pids") or next(iter(self.dirs.values()))

    def enter(self, pid: int) -> None:
        for path in {p for p in self.dirs.values()}:
            _write(path / "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        try:
            return sorted(int(x) for x in _read(self._any() / "cgroup.procs").split())
        except OSError:
            return []

    def tids(self) -> list[int]:
        name = "tasks" if self.version == 1 else "cgroup.threads"
        try:
            return [int(x) for x in _read(self._any() / name).split()]
        except OSError:
            return []

    def cpu_ns(self) -> int:
        """CPU time of every thread that ever ran in the cgroup, as booked (see
        runners.sandbox.procfs.process_cpu_ns: exact for threads not running at the read, up to a
        scheduler tick behind for one that is)."""
        path = self.dirs["cpu"]
        if self.version == 1:
            return int(_read(path / "cpuacct.usage"))
        for line in _read(path / "cpu.stat").splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) * 1000
        return 0

    def set_frozen(self, frozen: bool, *, timeout: float = 10.0) -> None:
        path = self.dirs["freezer"]
        if self.version == 1:
            _write(path / "freezer.state", "FROZEN" if frozen else "THAWED")
            done = lambda: _read(path / "freezer.state").strip() == ("FROZEN" if frozen else "THAWED")  # noqa: E731
        else:
            _write(path / "cgroup.freeze", "1" if frozen else "0")
            done = lambda: f"frozen {int(frozen)}" in _read(path / "cgroup.events")  # noqa: E731
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not reach {'frozen' if frozen else 'thawed'} in {timeout:.0f} s")
            time.sleep(0.001)
            if frozen and self.version == 1:
                # The v1 freezer tries each task once per write: a task that was running when it
                # came (on its way to a stop signal, Worker._set_frozen) and stopped afterwards is
                # never frozen. Another write freezes the stopped ones in place.
                _write(path / "freezer.state", "FROZEN")

    def kill_all(self, *, timeout: float = 10.0) -> list[int]:
        """SIGKILL every process (frozen first, so none can fork meanwhile); wait until none is left."""
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while True:
            if "freezer" in self.dirs:
                try:
                    self.set_frozen(True, timeout=1.0)
                except (OSError, TimeoutError):
                    pass
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except OSError:
                    pass
            if "freezer" in self.dirs:
                try:
                    self.set_frozen(False, timeout=1.0)
                except (OSError, TimeoutError):
                    pass
            if not pids or time.monotonic() > deadline:
                return sorted(killed)
            time.sleep(0.005)

    def oom_killed(self) -> bool:
        path = self.dirs.get("memory")
        if path is None:
            return False
        try:
            text = _read(path / ("memory.oom_control" if self.version == 1 else "memory.events"))
        except OSError:
            return False
        return any(line.startswith("oom_kill ") and int(line.split()[1]) > 0 for line in text.splitlines())

    def remove(self) -> None:
        self.kill_all()
        for path in set(self.dirs.values()):
            _rmdir(path)


def _rmdir(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # the last exited task is still being released


class SandboxCgroups:
    """The sandbox's own cgroup directory in each hierarchy, and its workers' below it."""

    def __init__(self, version: int, bases: dict[str, Path], name: str, limits: Limits) -> None:
        self.version = version
        self.limits = limits
        self.dirs = {c: base / name for c, base in bases.items()}
        for controller, path in self.dirs.items():
            path.mkdir(exist_ok=True)
            if controller == "cpuset" and version == 1:
                self._configure_cpuset(path, bases[controller])
        if version == 2 and self.dirs:
            root = next(iter(self.dirs.values()))
            wanted = " ".join(f"+{c}" for c in ("cpuset", "memory", "pids") if c in self.dirs)
            if wanted:
                _write(root / "cgroup.subtree_control", wanted)

    def _configure_cpuset(self, path: Path, parent: Path) -> None:
        cpus = ",".join(map(str, self.limits.cpus)) or _read(parent / "cpuset.effective_cpus").strip()
        _write(path / "cpuset.cpus", cpus)
        _write(path / "cpuset.mems", _read(parent / "cpuset.effective_mems").strip())

    def worker(self, name: str) -> WorkerCgroup:
        dirs = {c: p / name for c, p in self.dirs.items()}
        for path in set(dirs.values()):
            path.mkdir()
        cpus = ",".join(map(str, self.limits.cpus))
        if "cpuset" in dirs:
            if self.version == 1:
                self._configure_cpuset(dirs["cpuset"], self.dirs["cpuset"])
            elif cpus:
                _write(dirs["cpuset"] / "cpuset.cpus", cpus)
        if "memory" in dirs:
            _write(dirs["memory"] / ("memory.limit_in_bytes" if self.version == 1 else "memory.max"), str(self.limits.memory_bytes))
        if "pids" in dirs:
            _write(dirs["pids"] / "pids.max", str(self.limits.max_tasks))
        return WorkerCgroup(self.version, dirs)

    def remove(self) -> None:
        remove_tree(self.version, self.dirs)


def remove_tree(version: int, dirs: dict[str, Path]) -> None:
    """Kill whatever runs in a sandbox's cgroups and remove them, workers first."""
    for path in set(dirs.values()):
        if path.is_dir():
            for child in [p for p in path.iterdir() if p.is_dir()]:
                WorkerCgroup(version, {c: d / child.name for c, d in dirs.items() if (d / child.name).is_dir()}).remove()
    left = {c: d for c, d in dirs.items() if d.is_dir()}
    if left:
        WorkerCgroup(version, left).remove()


def remove_stale(version: int, bases: dict[str, Path]) -> None:
    """Sandbox cgroups (named dyno-<owner pid>-<token>) whose owner died without closing them."""
    names = {p.name for base in set(bases.values()) if base.is_dir() for p in base.glob(PREFIX + "*")}
    for name in names:
        try:
            owner = int(name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
            remove_tree(version, {c: base / name for c, base in bases.items()})
