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


def welch_difference_ci(first: Sequence[float], second: Sequence[float], *, confidence: float = 0.95) -> Estimate:
    """mean(first) - mean(second) with Welch's t interval (unequal variances, Welch-Satterthwaite
    degrees of freedom). For small groups: a percentile bootstrap of a mean of 5 values spans
    about 1.96 of its standard errors shrunk by sqrt(4/5) where Student's t with 4 degrees
    of freedom asks 2.78, so its 95% interval held the truth far less often than 95% (the
    next-arm judge rejected honest candidates on groups of 4-6 rounds: 1.14-1.17x with lower
    bounds 1.07-1.08, 2026-12-05/06). Needs two values in each group."""
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        raise ValueError("Welch's interval needs two values in each group")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    point = float(a.mean() - b.mean())
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Estimate(point, point, point)
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    margin = t_quantile(0.5 + confidence / 2.0, df) * se
    return Estimate(point, point - margin, point + margin)


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile for 0.5 <= p < 1 and df > 0 (real degrees of freedom): the density
    integrated by Simpson's rule, bisected on the cumulative figure (4 significant digits and
    more; no statistics library is a dependency)."""
    if not 0.5 <= p < 1.0 or df <= 0:
        raise ValueError(f"t quantile of p={p}, df={df}: needs 0.5 <= p < 1 and df > 0")
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float) -> float:
        x = np.linspace(0.0, t, 4097)
        y = scale * (1.0 + x * x / df) ** (-(df + 1) / 2)
        return 0.5 + (x[1] - x[0]) / 3 * (y[0] + y[-1] + 4 * y[1:-1:2].sum() + 2 * y[2:-1:2].sum())

    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, high * 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < p else (low, middle)
    return (low + high) / 2


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
