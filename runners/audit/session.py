"""An audit session: one sandbox, its trusted baseline workers, and each spec's shared input file.

Trusted side. Shared by every spec of one audit, suite run or optimizer search.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Any

from runners import suite
from runners.audit.inputs import DoneRecord, SharedInputs
from runners.measure import Protocol
from runners.sandbox import Sandbox, SandboxConfig, SandboxError, Worker
from runners.suite import WorkloadSpec

WORKER_HANDLER = "runners.audit.worker:KernelWorker"
class HarnessError(RuntimeError):
    """The audit could not run for a reason that is not the candidate's (bad arguments, broken baseline)."""


@dataclass
class Binding:
    """A worker's view of one spec's inputs: where it mapped them (reported before any candidate code
    ran in it, so the address is the harness's)."""

    key: str
    base: int
    nbytes: int
    done: DoneRecord | None = None  # the page the worker reports finished calls on (stepped samples)

    @property
    def region(self) -> tuple[int, int]:
        return self.base, self.base + self.nbytes


def host_freezes(sandbox: Sandbox, device: str) -> bool:
    """Whether waiting workers can be frozen whole between their samples: CPU on a host that
    accounts and freezes a whole process tree (kernel and whole-model audits alike)."""
    return device == "cpu" and bool(sandbox.info().get("accounts_tree"))


class AuditSession:
    """A sandbox plus trusted baseline workers, reused across specs and candidates."""

    def __init__(self, *, device: str, sandbox: Sandbox | None = None, config: SandboxConfig | None = None) -> None:
        self.device = device
        self._own_sandbox = sandbox is None
        if sandbox is None:
            config = config or SandboxConfig(device=device)
            from dataclasses import replace

            sandbox = Sandbox(replace(config, worker_handler=WORKER_HANDLER))
        self.sandbox = sandbox
        self._trusted: list[Worker] = []
        self._loaded: dict[int, str] = {}
        self.bindings: dict[int, Binding] = {}
        self._inputs: dict[str, SharedInputs] = {}
        # Calibrated once per spec and protocol: (calls per sample, the baseline's seconds per call).
        self.calibration: dict[str, tuple[int, float]] = {}

    def __enter__(self) -> AuditSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def freezes(self) -> bool:
        """Whether outputs are read from frozen workers (CPU on a host that accounts and freezes a
        whole process tree); otherwise workers commit to checksums that are challenged."""
        return host_freezes(self.sandbox, self.device)

    def _shared_dir(self) -> str:
        directory = getattr(self.sandbox, "shared_dir", None)
        return str(directory) if directory else tempfile.gettempdir()

    def inputs(self, spec: WorkloadSpec, slots: int) -> SharedInputs:
        """The spec's shared input file with at least `slots` slots (a larger one replaces a smaller)."""
        current = self._inputs.get(spec.key)
        if current is not None and current.slots >= slots:
            return current
        if current is not None:
            current.close()
        created = SharedInputs(self._shared_dir(), spec, slots, device=self.device)
        self._inputs[spec.key] = created
        return created

    def bind(self, worker: Worker, inputs: SharedInputs, protocol: Protocol) -> Binding:
        """Map `inputs` in `worker`. For a candidate worker, call before its code is loaded."""
        binding = self.bindings.get(worker.pid)
        if binding is not None and binding.key == inputs.path:
            return binding
        if binding is not None and binding.done is not None:
            binding.done.close()
        done = None
        if self.device == "cpu" and getattr(worker, "scratch", None):
            try:
                done = DoneRecord(worker.scratch, len(suite.output_shapes(inputs.spec)))
            except (OSError, ValueError):
                done = None  # the worker's samples are then not stepped (every slot revealed up front)
        try:
            reply = worker.call("bind", timeout=protocol.load_timeout_s * 2, spec=inputs.spec.to_dict(), path=inputs.path, slots=inputs.slots,
                                done_path=done.path if done is not None else None)
        except SandboxError as exc:
            if worker.trusted:
                raise HarnessError(f"a trusted worker could not map the inputs of {inputs.spec.key}: {exc} {exc.detail}") from exc
            raise
        binding = Binding(key=inputs.path, base=int(reply.header.get("base", 0)), nbytes=int(reply.header.get("nbytes", 0)), done=done)
        self.bindings[worker.pid] = binding
        return binding

    def load(self, worker: Worker, spec: WorkloadSpec, source: str, protocol: Protocol, *, label: str) -> None:
        try:
            worker.call("load", timeout=protocol.load_timeout_s, spec=spec.to_dict(), source=source, module=label,
                        l2_flush_bytes=protocol.l2_flush_bytes)
        except SandboxError as exc:
            if worker.trusted:
                raise HarnessError(f"the {label} failed to load for {spec.key}: {exc} {exc.detail}") from exc
            raise

    def baselines(self, spec: WorkloadSpec, count: int, protocol: Protocol, inputs: SharedInputs) -> list[Worker]:
        """`count` trusted workers with the spec's baseline loaded and `inputs` mapped."""
        self._trusted = [w for w in self._trusted if w.failure is None]
        while len(self._trusted) < count:
            try:
                self._trusted.append(self.sandbox.spawn("baseline"))
            except SandboxError as exc:
                raise HarnessError(f"could not start a baseline worker: {exc} {exc.detail}") from exc
        workers = self._trusted[:count]
        for worker in workers:
            self.bind(worker, inputs, protocol)
            if self._loaded.get(worker.pid) != spec.key:
                self.load(worker, spec, suite.baseline_source(spec), protocol, label="baseline")
                self._loaded[worker.pid] = spec.key
        return workers

    def renew_baselines(self, spec: WorkloadSpec, count: int, protocol: Protocol, inputs: SharedInputs) -> list[Worker]:
        """Close the trusted workers and start `count` fresh ones (a new worker generation)."""
        for worker in self._trusted:
            self._forget(worker)
            worker.close()
        self._trusted.clear()
        return self.baselines(spec, count, protocol, inputs)

    def _forget(self, worker: Worker) -> None:
        self._loaded.pop(worker.pid, None)
        binding = self.bindings.pop(worker.pid, None)
        if binding is not None and binding.done is not None:
            binding.done.close()

    def retire(self, worker: Worker) -> None:
        """Close an untrusted worker the session bound (a candidate of an earlier generation)."""
        self._forget(worker)
        worker.close()

    def info(self) -> dict[str, Any]:
        return self.sandbox.info()

    def close(self) -> None:
        for worker in self._trusted:
            worker.close()
        self._trusted.clear()
        for inputs in self._inputs.values():
            inputs.close()
        self._inputs.clear()
        if self._own_sandbox:
            self.sandbox.close()
