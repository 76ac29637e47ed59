"""The optimizer's evaluator, backed by the judge's quick grader: the optimizer's search speaks
`Candidate`, `Budget` and `Measurement` (optimizer.evaluation); the harness speaks sources,
rounds and timings (runners.evaluate.QuickGrader). This adapter is where the two meet."""

from __future__ import annotations

from optimizer.evaluation import Budget, Candidate, Measurement
from runners import stats
from runners.evaluate import QuickGrader
from runners.sandbox import SandboxConfig
from runners.suite import WorkloadSpec


class SandboxEvaluator:
    """Grades the optimizer's proposals for one workload: sandboxed and verified like an audit."""

    def __init__(self, spec: WorkloadSpec, *, device: str = "cpu", seed: int | None = None,
                 sandbox_config: SandboxConfig | None = None) -> None:
        self.spec = spec
        self.device = device
        self._grader = QuickGrader(spec, device=device, seed=seed, sandbox_config=sandbox_config)

    def __enter__(self) -> SandboxEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def evaluate(self, candidate: Candidate, budget: Budget) -> Measurement:
        if candidate.workload != self.spec.name:
            raise ValueError(f"candidate is for {candidate.workload!r}, this evaluator grades {self.spec.name!r}")
        grade = self._grader.grade(candidate.source, rounds=budget.rounds, max_seconds=budget.max_seconds)
        if not grade.accepted:
            return Measurement(correct=False, median_s=None, reasons=grade.codes)
        return Measurement(
            correct=True,
            median_s=stats.median(grade.candidate_s),
            spread=stats.relative_iqr(grade.candidate_s),
            baseline_median_s=stats.median(grade.baseline_s),
            reasons=grade.codes,
        )

    def close(self) -> None:
        self._grader.close()
