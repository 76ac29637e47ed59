"""The report body: what a signed Dyno report says, built from plain data (no Django).
Owns the report schema, the billable-speedup statement, the baseline text and reproduction.

The body is a dict that `proof.canonical.canonical_bytes` turns into the exact signed bytes.
It is built only from the run's stored facts (never the clock or a random id), so the same run
always gives the same bytes. Money-relevant figures are decimal strings, never floats.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

from metering.fees import SPEEDUP_PLACES, report_speedup
from runs.figures import model_basis, model_stable

SCHEMA = "dyno.report/1"
RESULT_SCHEMA = "dyno.suite-result/1"

# DESIGN.md "The billed baseline is the honest one"; signed into every report so the reader
# knows what the speedup is over without trusting anything else.
CONTRACT_BASELINE = (
    "The billed baseline is the customer's workload as eager PyTorch runs it with the library's "
    "standard ops: F.scaled_dot_product_attention for attention, F.layer_norm, torch.softmax, "
    "F.rms_norm, F.silu and torch.matmul (cuBLAS / oneDNN); at model level, the uploaded model "
    "exactly as transformers runs it by default. Never a deliberately naive formulation. "
    "Reference points (torch.compile and vendor libraries) are reported beside it, not billed."
)
BILLING_RULE = (
    "The billable speedup is the lower bound of the paired-bootstrap 95% confidence interval of "
    f"the speedup over the contract baseline, rounded down to {SPEEDUP_PLACES} decimal places. "
    "A run whose A/A calibration is unstable bills nothing; a bound at or below 1 bills nothing; "
    "the contract's minimum speedup, price and share are applied by metering, not here. A model "
    "run's figure is its whole forward pass audited end to end (the audited phase with the lowest "
    "bound), stable when that audit's A/A controls are; its per-kernel (Amdahl) figure is a diagnostic."
)

# Where the platform serves what a recipe downloads (front:run-artifact, front:run-candidate,
# reports:keys); tests/reports/test_reproduce.py follows these paths through the real views.
ARTIFACT_URL = "/runs/{run_id}/artifact.json"
CANDIDATE_URL = "/runs/{run_id}/candidate.py"
KEYS_URL = "/.well-known/dyno-report-keys.json"
COMPARE_COMMAND = "python -m runners compare-report report.json result.json"
KERNELS_COMPARE_COMMAND = "python -m runners compare-report report.json kernels.json"


class NotBillable(StrEnum):
    """Why a figure in a report is not billable; signed into the body as a code."""

    UNSTABLE_CALIBRATION = "unstable_calibration"
    NO_MODEL_FIGURE = "no_model_figure"
    NO_PROVEN_SPEEDUP = "no_proven_speedup"
    NOT_ACCEPTED = "not_accepted"
    NO_CONFIDENCE_INTERVAL = "no_confidence_interval"
    SANDBOX_INCOMPLETE = "sandbox_incomplete"
    RUNNER_NOT_CALIBRATED = "runner_not_calibrated"
    DEVICE_CLOCK_UNTRUSTED = "device_clock_untrusted"


# Reasons that say the measurement itself cannot be trusted (not merely that it proves no speedup):
# metering refuses to deploy under such a report at all.
UNTRUSTED = frozenset({NotBillable.SANDBOX_INCOMPLETE.value, NotBillable.RUNNER_NOT_CALIBRATED.value,
                       NotBillable.DEVICE_CLOCK_UNTRUSTED.value})


_NOT_BILLABLE_TEXT = {
    NotBillable.UNSTABLE_CALIBRATION: "the A/A control's confidence interval strayed from 1.0 beyond "
                                      "tolerance, so this machine's measurements cannot be trusted",
    NotBillable.NO_MODEL_FIGURE: "the result holds no whole-model speedup",
    NotBillable.NO_PROVEN_SPEEDUP: "the 95% confidence interval's lower bound is not above 1.0",
    NotBillable.NOT_ACCEPTED: "the harness did not accept the optimized candidate",
    NotBillable.NO_CONFIDENCE_INTERVAL: "the result holds no confidence interval for this figure",
    NotBillable.SANDBOX_INCOMPLETE: "the runner could not provide every sandbox protection a billable "
                                    "audit needs (see the result's sandbox block), and its operator did "
                                    "not allow figures from it to bill",
    NotBillable.RUNNER_NOT_CALIBRATED: "the runner that measured this has no passing calibration on this "
                                       "platform (its A/A controls were unstable when it started, or it never "
                                       "calibrated: see environment.runner_calibration), so figures it "
                                       "measures do not bill",
    NotBillable.DEVICE_CLOCK_UNTRUSTED: "GPU kernel timings are CUDA events recorded inside the candidate's "
                                        "own process, which could report less than it took; until the "
                                        "harness times device work on its own clock, GPU kernel figures do not bill",
}


class ReportError(ValueError):
    """The data cannot make a report; the message says what is missing and what to do."""


@dataclass(frozen=True)
class ModelFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ModelFacts:
    """The measured model version, identified by its files' hashes."""

    organization: str  # the org's slug
    name: str
    version: int
    version_id: str
    kind: str
    family: str
    architecture: str
    parameter_count: int
    dtype: str
    files: tuple[ModelFile, ...] = ()


@dataclass(frozen=True)
class RunFacts:
    run_id: str
    hardware: str
    profile: str
    batch: int
    seq: int
    finished_at: str  # ISO 8601; the report's date, from the run, so rebuilding gives the same bytes
    artifact_sha256: str


@dataclass(frozen=True)
class Supersession:
    """What a re-audit report replaces and who asked for it."""

    report_id: str
    report_sha256: str
    reaudit_request_id: str
    requested_by: str
    reason: str


@dataclass(frozen=True)
class Billable:
    """One figure's billing statement: the CI lower bound and whether it bills."""

    ci_low: Decimal | None
    billable: bool
    reason: NotBillable | None = None

    def as_body(self) -> dict[str, Any]:
        return {
            "ci95_low": _text(self.ci_low),
            "billable_speedup": _text(self.ci_low) if self.billable else None,
            "billable": self.billable,
            "reason": self.reason.value if self.reason else None,
        }


@dataclass(frozen=True)
class ModelFigure:
    """The whole-model speedup as the billing fields copy it out (Decimal, rounded down)."""

    speedup: Decimal | None
    ci_low: Decimal | None
    ci_high: Decimal | None
    stable: bool
    billable: Billable = field(default_factory=lambda: Billable(None, False, NotBillable.NO_MODEL_FIGURE))


def report_body(*, kind: str, result: dict[str, Any], model: ModelFacts | None, run: RunFacts,
                supersedes: Supersession | None = None, organization: str = "") -> dict[str, Any]:
    """The full body of a report for one finished run (see module docstring).

    `model` is None for the audit of a submitted candidate: the result's `candidate` block (its
    source hash) identifies what was measured.
    """
    _check_result(result)
    figure = model_figure(result)
    suite = result.get("suite") or {}
    body: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": kind,
        "organization": model.organization if model else organization,
        "model_version": None if model is None else {
            "id": model.version_id, "name": model.name, "version": model.version, "kind": model.kind,
            "family": model.family, "architecture": model.architecture,
            "parameter_count": model.parameter_count, "dtype": model.dtype,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in model.files],
        },
        "run": {
            "id": run.run_id, "hardware": run.hardware, "profile": run.profile, "batch": run.batch,
            "seq": run.seq, "finished_at": run.finished_at,
        },
        "artifact_sha256": run.artifact_sha256 or None,
        "suite": {
            "version": suite.get("version"), "profile": suite.get("profile"),
            "manifest_sha256": suite.get("manifest_sha256"),
        },
        "environment": result.get("environment") or {},
        "contract_baseline": CONTRACT_BASELINE,
        "billing": billing_statement(result, figure),
        "reproduce": reproduction(run=run, result=result, model=model),
        "supersedes": None,
        "result": result,
    }
    if "verdict" in result:
        body["verdict"] = result["verdict"]
    if supersedes is not None:
        body["supersedes"] = {
            "report_id": supersedes.report_id, "report_sha256": supersedes.report_sha256,
            "reaudit_request_id": supersedes.reaudit_request_id,
            "requested_by": supersedes.requested_by, "reason": supersedes.reason,
        }
    return body


def sandbox_trusted(result: dict[str, Any]) -> bool:
    """Whether the runner's sandbox had every protection (or its operator explicitly allowed one
    that lacks some); results from before the sandbox said so count as trusted."""
    block = result.get("sandbox") or {}
    return block.get("complete") is not False or bool(block.get("operator_allowed_incomplete"))


def kernel_clock_trusted(result: dict[str, Any]) -> bool:
    """False where the kernel audits' times came from the candidate's own process (CUDA events
    recorded by the worker): `environment.kernel_clock`, and any CUDA result that does not say."""
    environment = result.get("environment") or {}
    clock = environment.get("kernel_clock")
    if clock is None:
        return not str(environment.get("device") or "").startswith("cuda")
    return clock != "cuda-events-in-worker"


def runner_calibrated(result: dict[str, Any]) -> bool:
    """False only when the runner recorded a failed calibration (none recorded: not known to fail)."""
    block = (result.get("environment") or {}).get("runner_calibration")
    return not (isinstance(block, dict) and block.get("billable") is False)


def model_figure(result: dict[str, Any]) -> ModelFigure:
    """The whole-model speedup, its CI and whether it bills; rounded down, never up. A model block
    on the end-to-end basis carries its own stability (its A/A controls); older results, and
    results without one, use the suite's calibration."""
    block = result.get("model") or {}
    stable = model_stable(result)
    speedup = _decimal(block.get("speedup"))
    ci = block.get("ci95") or [None, None]
    low, high = (_decimal(ci[0]), _decimal(ci[1])) if len(ci) == 2 else (None, None)
    if speedup is None:
        return ModelFigure(None, None, None, stable, Billable(None, False, NotBillable.NO_MODEL_FIGURE))
    # A rejected model block does not bill, whatever interval it carries (an honest runner clears
    # it; the platform does not take that on its word: red team 18).
    accepted = block.get("verdict", "accepted") == "accepted"
    return ModelFigure(speedup, low, high, stable, _billable(low, stable=stable, accepted=accepted,
                                                             trusted=sandbox_trusted(result),
                                                             calibrated=runner_calibrated(result)))


def billing_statement(result: dict[str, Any], figure: ModelFigure | None = None) -> dict[str, Any]:
    figure = figure or model_figure(result)
    stable = (result.get("calibration") or {}).get("stable") is True  # the kernel audits' own A/A
    workloads = []
    for workload in result.get("workloads") or []:
        ci = workload.get("ci95") or [None, None]
        low = _decimal(ci[0]) if len(ci) == 2 else None
        entry = _billable(low, stable=stable, accepted=workload.get("verdict") == "accepted",
                          trusted=sandbox_trusted(result), calibrated=runner_calibrated(result),
                          clock_trusted=kernel_clock_trusted(result))
        workloads.append({"name": workload.get("name"), "shape": workload.get("shape"),
                          "dtype": workload.get("dtype"), **entry.as_body()})
    reasons = []
    if not figure.stable:
        reasons.append(_reason(NotBillable.UNSTABLE_CALIBRATION))
    if not sandbox_trusted(result) and figure.billable.reason is not NotBillable.SANDBOX_INCOMPLETE:
        reasons.append(_reason(NotBillable.SANDBOX_INCOMPLETE))
    if not runner_calibrated(result) and figure.billable.reason is not NotBillable.RUNNER_NOT_CALIBRATED:
        reasons.append(_reason(NotBillable.RUNNER_NOT_CALIBRATED))
    if figure.billable.reason and figure.billable.reason is not NotBillable.UNSTABLE_CALIBRATION:
        reasons.append(_reason(figure.billable.reason))
    return {
        "basis": "ci95_low",
        "rule": BILLING_RULE,
        "billable": figure.billable.billable,
        "reasons": reasons,
        "calibration_stable": figure.stable,
        "model": {
            "speedup": _text(figure.speedup), "ci95_high": _text(figure.ci_high),
            # Which figure this is: the whole forward pass audited end to end (and its phase), or,
            # for results made before that basis, the kernel audits weighted by eager time.
            "figure": model_basis(result),
            **figure.billable.as_body(),
        },
        "workloads": workloads,
    }


def reproduction(*, run: RunFacts, result: dict[str, Any], model: ModelFacts | None) -> dict[str, Any]:
    """The recipe that re-measures this report: files to download, then literal shell lines run
    from the root of a Dyno clone, ending with `compare-report` against this report's intervals.

    A model run re-runs its whole-model audit (`model-audit`) on the downloaded artifact; the audit
    of a submitted candidate re-runs `audit` on the downloaded module. Same profile, device, shape
    and seed as the report measured.
    """
    recipe = _Recipe(run, result)
    commands = recipe.candidate_commands() if model is None else recipe.model_commands(model)
    return {
        "hardware": run.hardware,
        "workdir": "the root of a Dyno clone with its environment installed (make install, then "
                   ". .venv/bin/activate), holding the files below under these names",
        "files": recipe.files,
        "commands": commands,
        "verify_signature": "python -m proof verify report.json signature.json "
                            "--keys dyno-report-keys.json",
        "note": " ".join(recipe.notes),
    }


class _Recipe:
    """One report's recipe as it is built: the files it downloads and the notes it adds."""

    def __init__(self, run: RunFacts, result: dict[str, Any]) -> None:
        self.run = run
        self.result = result
        self.seed = (result.get("protocol") or {}).get("seed")
        self.files: list[dict[str, Any]] = [
            _file("report.json", "this report's 'Report (JSON, as signed)' download"),
            _file("signature.json", "this report's 'Signature' download"),
            _file("dyno-report-keys.json", "the platform's public keys", url=KEYS_URL),
        ]
        self.notes = ["Run on hardware matching `environment` (device, driver, torch, triton); timings vary "
                      "between machines. A measuring command exits 1 when its verdict is rejected and still "
                      "writes result.json. compare-report exits 0 when every figure agrees (the same verdict, "
                      "and the reproduced speedup inside this report's 95% interval) and 1 when one differs."]
        if self.seed is None:
            self.notes.append("The run recorded no seed: the reproduction draws fresh inputs.")

    def candidate_commands(self) -> list[str]:
        candidate = self.result.get("candidate") or {}
        digest, workload = candidate.get("source_sha256"), candidate.get("workload")
        if not digest or not workload:
            self.notes.append("The result does not name its candidate module: this report cannot be reproduced.")
            return []
        self.files.insert(0, _file("candidate.py", "the run page's 'candidate module' download",
                                   url=CANDIDATE_URL.format(run_id=self.run.run_id), sha256=digest))
        return [
            _checksum_line([(digest, "candidate.py")]),
            self._command("audit", ("--workload", workload), ("--candidate", "candidate.py")),
            COMPARE_COMMAND,
        ]

    def model_commands(self, model: ModelFacts) -> list[str]:
        digest = self.run.artifact_sha256
        if not digest:
            self.notes.append("The run stored no optimization artifact: this report cannot be reproduced.")
            return []
        self.files[:0] = [
            _file("artifact.json", "the run page's 'optimization artifact' download",
                  url=ARTIFACT_URL.format(run_id=self.run.run_id), sha256=digest),
            _file("model/", "your copy of the measured model version: the files under model_version.files, "
                            "same paths"),
        ]
        checks = [_checksum_line([(digest, "artifact.json")])]
        if model.files:
            checks.append(_checksum_line([(f.sha256, f"model/{f.path}") for f in model.files]))
        kernels: list[str] = []
        end_to_end_basis = (self.result.get("model") or {}).get("basis") == "end_to_end"
        if (self.result.get("optimization") or {}).get("kernels_in_artifact"):
            # The artifact's kernels audited again, weighted by the report's shares.
            kernels = [self._command("suite", ("--artifact", "artifact.json"), json_to="kernels.json"),
                       KERNELS_COMPARE_COMMAND]
            if end_to_end_basis:
                self.notes.append("model-audit re-measures the whole forward pass, whose lowest phase is the billed "
                                  "model figure (result.model.end_to_end); suite --artifact re-audits the kernels "
                                  "of the Amdahl figure beside it, a diagnostic.")
            else:
                self.notes.append("suite --artifact re-audits the kernels the billed model figure is weighted from, "
                                  "and compare-report recomputes that figure with the report's own weights; "
                                  "model-audit re-measures the whole forward pass (result.model.end_to_end).")
        elif end_to_end_basis:
            self.notes.append("model-audit re-measures the whole forward pass, whose lowest phase is the billed "
                              "model figure (result.model.end_to_end).")
        else:
            self.notes.append("model-audit re-measures the whole forward pass (result.model.end_to_end); the "
                              "billed model figure is weighted from per-workload audits whose kernels this "
                              "run's artifact does not carry (made before artifacts carried them).")
        return [
            *checks,
            *kernels,
            self._command("model-audit", ("--model", "model"), ("--artifact", "artifact.json"),
                          ("--batch", self.run.batch), ("--seq", self.run.seq)),
            COMPARE_COMMAND,
        ]

    def _command(self, name: str, *options: tuple[str, Any], json_to: str = "result.json") -> str:
        """`python -m runners NAME` with the options, then the report's profile, device and seed."""
        profile = (self.result.get("suite") or {}).get("profile") or self.run.profile
        end_to_end = (self.result.get("model") or {}).get("end_to_end") or {}
        device = end_to_end.get("device") or (self.result.get("environment") or {}).get("device")
        words = ["python", "-m", "runners", name]
        for flag, value in (*options, ("--profile", profile), ("--device", device), ("--seed", self.seed),
                            ("--json", json_to)):
            if value is not None:
                words += [flag, str(value)]
        return shlex.join(words)


def _file(name: str, how: str, *, url: str | None = None, sha256: str | None = None) -> dict[str, Any]:
    return {"name": name, "url": url, "how": how, "sha256": sha256}


def _checksum_line(entries: list[tuple[str, str]]) -> str:
    """`sha256sum -c` over the listed files: prints `NAME: OK` per file, fails on any other bytes."""
    pairs = " ".join(f"{shlex.quote(digest)} {shlex.quote(name)}" for digest, name in entries)
    return f"printf '%s  %s\\n' {pairs} | sha256sum -c -"


def _check_result(result: Any) -> None:
    if not isinstance(result, dict):
        raise ReportError("the run has no result to report on; only a succeeded run with a stored "
                          "result can be reported")
    if result.get("schema") != RESULT_SCHEMA:
        raise ReportError(f"the run's result has schema {result.get('schema')!r}; reports are made from "
                          f"{RESULT_SCHEMA!r} results written by `python -m runners suite|audit`")
    for name in ("suite", "environment", "calibration", "workloads"):
        if name not in result:
            raise ReportError(f"the run's result lacks {name!r}; the runner that wrote it is out of date")


def _billable(low: Decimal | None, *, stable: bool, accepted: bool, trusted: bool = True,
              calibrated: bool = True, clock_trusted: bool = True) -> Billable:
    if low is None:
        return Billable(None, False, NotBillable.NO_CONFIDENCE_INTERVAL)
    if not trusted:
        return Billable(low, False, NotBillable.SANDBOX_INCOMPLETE)
    if not clock_trusted:
        return Billable(low, False, NotBillable.DEVICE_CLOCK_UNTRUSTED)
    if not calibrated:
        return Billable(low, False, NotBillable.RUNNER_NOT_CALIBRATED)
    if not stable:
        return Billable(low, False, NotBillable.UNSTABLE_CALIBRATION)
    if not accepted:
        return Billable(low, False, NotBillable.NOT_ACCEPTED)
    if low <= 1:
        return Billable(low, False, NotBillable.NO_PROVEN_SPEEDUP)
    return Billable(low, True)


def _reason(code: NotBillable) -> dict[str, str]:
    return {"code": code.value, "message": _NOT_BILLABLE_TEXT[code]}


def _decimal(value: Any) -> Decimal | None:
    # The metering bridge: shortest float repr, rounded DOWN, so no report claims more than measured.
    if value is None or isinstance(value, bool):
        return None
    return report_speedup(value)


def _text(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


def not_billable_text(code: str) -> str:
    """The sentence for a reason code, for pages that show a body's codes to people."""
    try:
        return _NOT_BILLABLE_TEXT[NotBillable(code)]
    except ValueError:
        return code


# --- reading figures back out of a body (shared by the page, the PDF and the comparison) ---------


def as_number(value: Any) -> float | None:
    """A JSON number as float; None for anything else (bools are not numbers here)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def as_interval(value: Any) -> tuple[float, float] | None:
    """A `[low, high]` pair of numbers, or None."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        low, high = as_number(value[0]), as_number(value[1])
        if low is not None and high is not None:
            return (low, high)
    return None


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested objects as sorted (dotted.key, leaf) pairs; lists are leaves."""
    if isinstance(value, dict):
        items: list[tuple[str, Any]] = []
        for key in sorted(value):
            items += flatten(value[key], f"{prefix}.{key}" if prefix else str(key))
        return items
    return [(prefix, value)]


def shape_text(shape: Any) -> str:
    if isinstance(shape, dict):
        return " ".join(f"{k}={v}" for k, v in shape.items())
    if isinstance(shape, (list, tuple)):
        return "x".join(str(s) for s in shape)
    return "" if shape is None else str(shape)


def workload_label(workload: dict[str, Any]) -> str:
    """How people tell workloads apart: the name and the shape (dtype shown beside it)."""
    return f"{workload.get('name', '?')} {shape_text(workload.get('shape'))}".strip()
