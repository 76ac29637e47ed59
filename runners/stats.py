"""Statistics of the measurement protocol: medians, spreads and paired bootstrap confidence intervals.

Pure functions over plain floats (numpy inside); deterministic for a given seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class Estimate:
    """A point estimate (a speedup, a median) with its confidence interval."""

    point: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        """Half the interval's width relative to the point estimate."""
        return (self.high - self.low) / 2.0 / self.point if self.point else math.inf

    def within(self, tolerance: float) -> bool:
        """True when the whole interval lies inside 1 +- tolerance (an A/A control that passes)."""
        return 1.0 - tolerance <= self.low and self.high <= 1.0 + tolerance


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no values: the measurement produced no samples")
    return float(np.median(np.asarray(values, dtype=np.float64)))


def relative_iqr(values: Sequence[float]) -> float:
    """Interquartile range over the median: the spread the optimizer's Measurement reports."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("spread of no values: the measurement produced no samples")
    q1, q2, q3 = np.quantile(data, [0.25, 0.5, 0.75])
    return float((q3 - q1) / q2) if q2 else math.inf


def geomean(values: Sequence[float]) -> float:
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0 or np.any(data <= 0):
        raise ValueError("geometric mean needs positive values")
    return float(np.exp(np.mean(np.log(data))))


def paired_ratio_ci(
    numerators: Sequence[float],
    denominators: Sequence[float],
    *,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    clusters: Sequence[int] | None = None,
) -> Estimate:
    """Median of per-round ratios numerator/denominator, with a paired percentile bootstrap CI.

    Rounds are resampled as pairs, so noise shared by both sides of a round (another process
    waking up, a clock change) cancels instead of widening the interval.

    With `clusters` (a label per round: the worker generation that measured it), the bootstrap is
    two-stage: clusters are drawn with replacement, then rounds within each drawn cluster. What
    differs between processes (a layout fixed for a process's life) is then inside the interval.
    """
    if clusters is not None and len(set(clusters)) > 1:
        return _clustered_ratio_ci(numerators, denominators, clusters, resamples=resamples, confidence=confidence, seed=seed)
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    if num.shape != den.shape or num.size == 0:
        raise ValueError(f"paired samples must be non-empty and equal in length ({num.size} vs {den.size})")
    if np.any(num <= 0) or np.any(den <= 0):
        raise ValueError("timings must be positive")
    ratios = num / den
    point = float(np.median(ratios))
    if ratios.size == 1:
        return Estimate(point, point, point)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, ratios.size, size=(resamples, ratios.size))
    boot = np.median(ratios[picks], axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(boot, [alpha, 1.0 - alpha])
    return Estimate(point, float(low), float(high))


def median_ci(values: Sequence[float], *, resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Estimate:
    """Median with a percentile bootstrap CI; the harness tests excesses with its lower bound."""
    return _bootstrap_ci(values, np.median, resamples=resamples, confidence=confidence, seed=seed)


def mean_ci(values: Sequence[float], *, resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Estimate:
    """Mean with a percentile bootstrap CI: for figures where what matters lands in some rounds
    only (work aimed at the arm measured after the candidate misses the rounds it is last in)."""
    return _bootstrap_ci(values, np.mean, resamples=resamples, confidence=confidence, seed=seed)


def mean_difference_ci(first: Sequence[float], second: Sequence[float], *, resamples: int = 2000, confidence: float = 0.95,
                       seed: int = 0) -> Estimate:
    """mean(first) - mean(second), each group resampled on its own, with a percentile bootstrap CI."""
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("a difference of means needs values in both groups")
    rng = np.random.default_rng(seed)
    boot = (a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1)
            - b[rng.integers(0, b.size, size=(resamples, b.size))].mean(axis=1))
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(boot, [alpha, 1.0 - alpha])
    return Estimate(float(a.mean() - b.mean()), float(low), float(high))


def _bootstrap_ci(values: Sequence[float], statistic: Callable[..., Any], *, resamples: int, confidence: float, seed: int) -> Estimate:
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("a statistic of no values: the measurement produced no samples")
    point = float(statistic(data))
    if data.size == 1:
        return Estimate(point, point, point)
    rng = np.random.default_rng(seed)
    boot = statistic(data[rng.integers(0, data.size, size=(resamples, data.size))], axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(boot, [alpha, 1.0 - alpha])
    return Estimate(point, float(low), float(high))


def _clustered_ratio_ci(numerators: Sequence[float], denominators: Sequence[float], clusters: Sequence[int], *,
                        resamples: int, confidence: float, seed: int) -> Estimate:
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    labels = list(clusters)
    if num.shape != den.shape or num.size == 0 or len(labels) != num.size:
        raise ValueError(f"paired samples and cluster labels must be non-empty and equal in length ({num.size}, {den.size}, {len(labels)})")
    if np.any(num <= 0) or np.any(den <= 0):
        raise ValueError("timings must be positive")
    ratios = num / den
    groups = [ratios[[i for i, label in enumerate(labels) if label == name]] for name in dict.fromkeys(labels)]
    rng = np.random.default_rng(seed)
    boot = np.empty(resamples)
    for b in range(resamples):
        drawn = [groups[i] for i in rng.integers(0, len(groups), size=len(groups))]
        boot[b] = np.median(np.concatenate([g[rng.integers(0, g.size, size=g.size)] for g in drawn]))
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(boot, [alpha, 1.0 - alpha])
    return Estimate(float(np.median(ratios)), float(low), float(high))
