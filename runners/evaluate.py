"""Evaluation's public entry points: audit candidates against the suite (`audit_candidate`,
`run_suite`, `audit_specs`) and grade a search's proposals quickly (`QuickGrader`), all
with one engine (`runners.audit.kernel.KernelAudit`).

The parent chooses every input, computes every reference, and judges what workers send back.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence

import torch

from runners import measure, result, suite
from runners.audit.kernel import REFERENCE_POINTS, KernelAudit
from runners.audit.outcome import entry as _entry, error_entry as _error_entry
from runners.audit.session import AuditSession, HarnessError
from runners.fingerprint import environment_fingerprint
from runners.measure import Protocol
from runners.sandbox import SandboxConfig
from runners.suite import WorkloadSpec

Progress = Callable[[float, str], None]

__all__ = ["AuditSession", "HarnessError", "QuickGrade", "QuickGrader", "REFERENCE_POINTS", "audit_candidate", "audit_specs", "run_suite"]


def _audit_spec(session: AuditSession, spec: WorkloadSpec, source: str, **options: Any):
    return KernelAudit(session, spec, source, **options).run()


# --------------------------------------------------------------------------------------------
# Public entry points.


def _sandbox_config(device: str, protocol: Protocol, config: SandboxConfig | None) -> SandboxConfig:
    """The caller's limits with the protocol's thread count (which is part of what is measured)."""
    config = config or SandboxConfig(device=device)
    return replace(config, device=device, threads=protocol.worker_threads())


def _resolve(profile: str, device: str | None, protocol: Protocol | None) -> tuple[str, Protocol]:
    if profile not in suite.profile_names():
        raise HarnessError(f"unknown profile {profile!r}; use one of {', '.join(suite.profile_names())}")
    device = device or suite.profile_device(profile)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise HarnessError(f"device {device!r} requested but no CUDA device is visible; use --profile cpu or cpu-ci")
    return device, protocol or measure.protocol_for(profile)


def withhold_unheld_stepping(entries: list[dict[str, Any]]) -> None:
    """Entries stepped without the core fence do not bill: their worker ran between its done
    records and the next announcements, where input-independent work costs it nothing
    (docs/protocol.md, the core fence)."""
    for item in entries:
        timing = item.get("timing") or {}
        if timing.get("calls_revealed_one_at_a_time") and not timing.get("values_copied_while_worker_held"):
            item["billable"], item["billable_speedup"] = False, None


def _document(
    *,
    kind: str,
    profile: str,
    device: str,
    protocol: Protocol,
    seed: int,
    session: AuditSession,
    entries: list[dict[str, Any]],
    specs: list[WorkloadSpec] | None = None,
    candidate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    sandbox = sandbox_block(session.sandbox.info())
    if not sandbox_trusted(sandbox):
        for item in entries:  # figures from a host lacking protections bill only if the operator says so
            item["billable"], item["billable_speedup"] = False, None
    withhold_unheld_stepping(entries)
    environment = environment_fingerprint(device, threads=session.sandbox.config.threads)
    environment["sandbox_protections"] = sandbox.get("protections")
    environment["kernel_clock"] = kernel_clock(device)
    if environment["kernel_clock"] == WORKER_CUDA_EVENTS:
        for item in entries:  # the candidate's own process reported these times
            item["billable"], item["billable_speedup"] = False, None
    document = result.build_document(
        kind=kind,
        profile=profile,
        suite_version=suite.SUITE_VERSION,
        manifest_sha256=suite.manifest_sha256(profile, protocol=protocol, specs=specs),
        environment=environment,
        sandbox=sandbox,
        protocol={**protocol.to_dict(), "seed": seed},
        workloads=entries,
        aa_tolerance=protocol.aa_tolerance,
        candidate=candidate,
    )
    result.validate_document(document)
    return document


# Where kernel audits' times come from. On CPU the parent's clock around each call (stepped
# samples) or the worker's timestamps held to the parent's window and the kernel's CPU accounting
# of the worker's tree. On a GPU, CUDA events recorded by the worker: the candidate's own process,
# which may report any time that fits its host interval (an open finding of the red team), so
# those figures never bill (platform: reports.document.kernel_clock_trusted).
WORKER_CUDA_EVENTS = "cuda-events-in-worker"


def kernel_clock(device: str) -> str:
    return WORKER_CUDA_EVENTS if device.startswith("cuda") else "host"


def sandbox_block(info: dict[str, Any]) -> dict[str, Any]:
    """The sandbox's own account of its protections, plus whether this runner's operator allows
    billable figures from it when some are missing (DYNO_SANDBOX_ALLOW_INCOMPLETE=True)."""
    block = dict(info)
    flag = os.environ.get("DYNO_SANDBOX_ALLOW_INCOMPLETE", "False")
    if flag not in ("True", "False"):
        raise HarnessError(f"DYNO_SANDBOX_ALLOW_INCOMPLETE must be True or False, not {flag!r}")
    block["operator_allowed_incomplete"] = flag == "True"
    return block


def sandbox_trusted(block: dict[str, Any]) -> bool:
    return block.get("complete") is not False or bool(block.get("operator_allowed_incomplete"))


@contextlib.contextmanager
def _session_scope(session: AuditSession | None, device: str, config: SandboxConfig | None) -> Iterator[AuditSession]:
    """The caller's session as is, or a fresh one closed on exit."""
    if session is not None:
        if session.device != device:
            raise HarnessError(f"the session measures on {session.device!r}, the audit asked for {device!r}")
        if config is not None and session.sandbox.config.threads != config.threads:
            raise HarnessError(
                f"the session's workers use {session.sandbox.config.threads} thread(s), the protocol needs {config.threads}"
            )
        yield session
        return
    with AuditSession(device=device, config=config) as fresh:
        yield fresh


class _ParentThreads:
    """The parent computes references on one thread while it audits (its idle thread pool would
    otherwise spin into the next worker's window on a small machine), then restores its setting."""

    def __enter__(self) -> None:
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self._threads)


@dataclass(frozen=True)
class _Job:
    spec: WorkloadSpec
    source: str
    impl: str
    key: str | None = None


def _audit_jobs(
    jobs: Sequence[_Job],
    *,
    kind: str,
    profile: str,
    device: str | None,
    seed: int | None,
    progress: Progress | None,
    protocol: Protocol | None,
    reference_points: Sequence[str],
    sandbox_config: SandboxConfig | None,
    session: AuditSession | None,
    own_shapes: bool,
    candidate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The engine behind every public entry point: one sandbox session, each job audited in turn.

    An audit (`kind='audit'`) stops at the first harness error; a suite records it as that
    workload's error and goes on, so one broken workload cannot hide the others' results."""
    device, protocol = _resolve(profile, device, protocol)
    for name in reference_points:
        if name not in REFERENCE_POINTS:
            raise HarnessError(f"unknown reference point {name!r}; use one of {', '.join(REFERENCE_POINTS)}")
    seed = secrets.randbits(62) if seed is None else seed
    entries: list[dict[str, Any]] = []
    with _ParentThreads(), _session_scope(session, device, _sandbox_config(device, protocol, sandbox_config)) as session:
        peaks = measure.device_peaks(environment_fingerprint(device)["device_name"], threads=session.sandbox.config.threads)
        for index, job in enumerate(jobs):
            def job_progress(fraction: float, message: str, index: int = index) -> None:
                if progress is not None:
                    progress((index + fraction) / len(jobs), message)

            try:
                outcome = _audit_spec(
                    session, job.spec, job.source, protocol=protocol, seed=seed, reference_points=reference_points, progress=job_progress
                )
                entry = _entry(outcome, source=job.source, impl=job.impl, protocol=protocol, seed=seed, peaks=peaks)
            except HarnessError as exc:
                if kind == "audit":
                    raise
                entry = _error_entry(job.spec, job.source, job.impl, protocol, seed, str(exc))
            if job.key is not None:
                entry["key"] = job.key
            entries.append(entry)
        document = _document(
            kind=kind,
            profile=profile,
            device=device,
            protocol=protocol,
            seed=seed,
            session=session,
            entries=entries,
            specs=None if own_shapes else [job.spec for job in jobs],
            candidate=candidate,
        )
    if progress is not None:
        progress(1.0, f"{kind} done" + (f": {document['verdict']}" if kind == "audit" else ""))
    return document


def audit_candidate(
    workload: str,
    source: str,
    *,
    profile: str,
    device: str | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    protocol: Protocol | None = None,
    reference_points: Sequence[str] = (),
    sandbox_config: SandboxConfig | None = None,
    label: str = "candidate",
    session: AuditSession | None = None,
) -> dict[str, Any]:
    """Audit one candidate module for `workload` at every shape `profile` has for it.

    Returns a validated `dyno.suite-result/1` document with a top-level `verdict`. Raises
    HarnessError (or ValueError for an unknown workload) when the audit cannot run at all.
    Pass an `AuditSession` to reuse its sandbox and baseline workers across audits.
    """
    if profile not in suite.profile_names():
        raise HarnessError(f"unknown profile {profile!r}; use one of {', '.join(suite.profile_names())}")
    jobs = [_Job(spec, source, label) for spec in suite.find_spec(profile, workload)]
    candidate = {"label": label, "workload": workload, "source_sha256": hashlib.sha256(source.encode()).hexdigest()}
    return _audit_jobs(
        jobs,
        kind="audit",
        profile=profile,
        device=device,
        seed=seed,
        progress=progress,
        protocol=protocol,
        reference_points=reference_points,
        sandbox_config=sandbox_config,
        session=session,
        own_shapes=True,
        candidate=candidate,
    )


def run_suite(
    profile: str,
    *,
    workloads: Sequence[str] | None = None,
    candidate_sources: dict[str, str] | None = None,
    device: str | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    protocol: Protocol | None = None,
    reference_points: Sequence[str] = (),
    sandbox_config: SandboxConfig | None = None,
    session: AuditSession | None = None,
) -> dict[str, Any]:
    """Baseline vs candidate for every spec of `profile` (or of `workloads`).

    `candidate_sources` maps a workload name to a candidate module's source; a workload without
    one is measured against the baseline itself (an A/A calibration run).
    """
    if profile not in suite.profile_names():
        raise HarnessError(f"unknown profile {profile!r}; use one of {', '.join(suite.profile_names())}")
    names = list(workloads) if workloads else suite.workload_names()
    for name in names:
        suite.find_spec(profile, name)  # ValueError names the valid workloads
    jobs = []
    for spec in suite.profile_specs(profile):
        if spec.name not in names:
            continue
        supplied = (candidate_sources or {}).get(spec.name)
        if supplied is None:
            jobs.append(_Job(spec, suite.baseline_source(spec), "baseline (A/A calibration)"))
        else:
            jobs.append(_Job(spec, supplied, "candidate"))
    return _audit_jobs(
        jobs,
        kind="suite",
        profile=profile,
        device=device,
        seed=seed,
        progress=progress,
        protocol=protocol,
        reference_points=reference_points,
        sandbox_config=sandbox_config,
        session=session,
        own_shapes=True,
    )


def audit_specs(
    specs: Sequence[WorkloadSpec],
    sources: Sequence[str],
    *,
    profile: str,
    keys: Sequence[str] | None = None,
    device: str | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    protocol: Protocol | None = None,
    reference_points: Sequence[str] = (),
    sandbox_config: SandboxConfig | None = None,
    label: str = "candidate",
    session: AuditSession | None = None,
) -> dict[str, Any]:
    """Audit candidates at shapes of the caller's choosing (a model's own workloads) under
    `profile`'s protocol. Returns a 'suite' document whose manifest hash covers these specs;
    `keys`, when given, become each workload entry's `key`."""
    if len(specs) != len(sources) or (keys is not None and len(keys) != len(specs)):
        raise HarnessError(f"{len(specs)} specs need as many sources (got {len(sources)}) and keys")
    if profile not in suite.profile_names():
        raise HarnessError(f"unknown profile {profile!r}; use one of {', '.join(suite.profile_names())}")
    jobs = [
        _Job(spec, source, label, None if keys is None else keys[index])
        for index, (spec, source) in enumerate(zip(specs, sources))
    ]
    return _audit_jobs(
        jobs,
        kind="suite",
        profile=profile,
        device=device,
        seed=seed,
        progress=progress,
        protocol=protocol,
        reference_points=reference_points,
        sandbox_config=sandbox_config,
        session=session,
        own_shapes=False,
    )


@dataclass(frozen=True)
class QuickGrade:
    """A quick audit's outcome, in the judge's terms: accepted or not, the timings, the reason codes."""

    accepted: bool
    candidate_s: list[float]
    baseline_s: list[float]
    codes: tuple[str, ...]


class QuickGrader:
    """Quick, noisy, but sandboxed and verified like an audit: what a search grades proposals with
    (the optimizer's adapter is `pipeline.evaluator.SandboxEvaluator`).

    One zygote and one trusted baseline worker live as long as the grader; each candidate gets a
    fresh forked worker (about 0.1 s), so grading many candidates stays cheap.
    """

    def __init__(
        self,
        spec: WorkloadSpec,
        *,
        device: str = "cpu",
        seed: int | None = None,
        sandbox_config: SandboxConfig | None = None,
    ) -> None:
        self.spec = spec
        self.device = device
        self._seed = secrets.randbits(62) if seed is None else seed
        self._profile = "gpu" if device.startswith("cuda") else "cpu-ci"
        self._config = _sandbox_config(device, measure.protocol_for(self._profile), sandbox_config)
        self._session: AuditSession | None = None
        self._count = 0

    def __enter__(self) -> QuickGrader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def grade(self, source: str, *, rounds: int, max_seconds: float) -> QuickGrade:
        if self._session is None:
            self._session = AuditSession(device=self.device, config=self._config)
        self._count += 1
        protocol = measure.quick_protocol(self._profile, rounds=rounds)
        seed = suite.derive_seed(self._seed, "evaluation", self._count)
        with _ParentThreads():
            outcome = _audit_spec(
                self._session,
                self.spec,
                source,
                protocol=protocol,
                seed=seed,
                aa_control=False,
                deadline=time.monotonic() + max_seconds,
            )
        codes = tuple(dict.fromkeys(r.code for r in outcome.reasons))
        accepted = outcome.verdict == "accepted" and bool(outcome.candidate)
        return QuickGrade(accepted=accepted, candidate_s=list(outcome.candidate or []),
                          baseline_s=list(outcome.baseline or []), codes=codes)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
