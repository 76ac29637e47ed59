"""Dyno's kernel optimizer: Triton kernels and CPU formulations per workload family, a budgeted
search over them graded by the runner's evaluator, a tuning cache, and model-level rewriting.

Pure library (torch, triton, transformers for model loading); it never imports the runners.
"""

from optimizer.cache import JsonlTuningCache, MemoryTuningCache, TuningCache, TuningEntry, TuningKey, make_key
from optimizer.candidates import FAMILIES, candidate_space, load_kernel, render_candidate
from optimizer.evaluation import Budget, Candidate, Evaluator, Measurement
from optimizer.search import Trial, TuningResult, search, tune_workload


def __getattr__(name: str):  # model-level API loads transformers lazily: kernels alone stay light
    if name in ("apply", "optimize_model", "OptimizationArtifact", "ARTIFACT_SCHEMA"):
        from optimizer import model

        return getattr(model, name)
    raise AttributeError(f"module 'optimizer' has no attribute {name!r}")


__all__ = [
    "ARTIFACT_SCHEMA", "FAMILIES", "Budget", "Candidate", "Evaluator", "JsonlTuningCache", "Measurement",
    "MemoryTuningCache", "OptimizationArtifact", "Trial", "TuningCache", "TuningEntry", "TuningKey", "TuningResult",
    "apply", "candidate_space", "load_kernel", "make_key", "optimize_model", "render_candidate", "search",
    "tune_workload",
]
