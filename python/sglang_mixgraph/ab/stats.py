"""Means and 95% confidence intervals over repeats, and paired ratios between two arms.

Each repeat of a cell gives one value per metric (a `bench_serving` run already averages or
takes percentiles over its requests; repeats are what varies between server starts and over
time). The interval is the Student t interval of the mean over repeats: mean +/- t(0.975,
n - 1) * s / sqrt(n). A ratio between a candidate arm and the baseline is taken per repeat
(repeat r of each arm ran next to each other, A B B A), and the interval is the same t
interval over those paired ratios, so drift that hits both arms of a pair cancels out.
With one repeat there is a value and no interval.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; the normal 1.96 above.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    assert df >= 1, df
    return _T975[df - 1] if df <= len(_T975) else 1.96


@dataclass(frozen=True)
class Estimate:
    mean: float
    ci95: float | None  # half-width; None with fewer than two values
    n: int

    @property
    def low(self) -> float | None:
        return None if self.ci95 is None else self.mean - self.ci95

    @property
    def high(self) -> float | None:
        return None if self.ci95 is None else self.mean + self.ci95

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "mean": self.mean,
            "ci95": self.ci95,
            "low": self.low,
            "high": self.high,
            "n": self.n,
        }


def estimate(values: list[float]) -> Estimate | None:
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Estimate(mean, None, 1)
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Estimate(mean, half, len(values))


def paired_ratio(candidate: dict[int, float], baseline: dict[int, float]) -> Estimate | None:
    """Ratio estimate over the repeats both arms finished; values keyed by repeat."""
    ratios = [
        candidate[r] / baseline[r]
        for r in sorted(set(candidate) & set(baseline))
        if baseline[r] != 0
    ]
    return estimate(ratios)
