"""Means and 95% intervals over repeats, paired ratios between two arms, accuracy intervals.

Each repeat of a cell gives one value per metric (a `bench_serving` run already averages or
takes percentiles over its requests; repeats are what varies between server starts and over
time).

- A metric of one arm: the mean over repeats with the Student t interval of the mean,
  mean +/- t(0.975, n - 1) * s / sqrt(n).
- A ratio candidate / baseline: taken per repeat (repeat r of each arm ran next to each other,
  A B B A, so drift that hits both arms of a pair cancels in its ratio), then on the log
  scale: the mean m and the t interval m +/- t(0.975, n - 1) * s / sqrt(n) of log(c_r / b_r),
  mapped back with exp. The ratio shown is exp(m), the geometric mean of the paired ratios,
  and the interval [exp(m - h), exp(m + h)] is always positive and symmetric in the sense
  that matters for a ratio (c/b and b/c get reciprocal intervals). A pair in which either
  value is not positive has no logarithm and is left out.
- Blocks: pairs are grouped by the block they ran in (one machine's visits; without a block
  order each repeat is its own block), each block's ratio is the exp of its pairs' mean
  log-ratio, and the pooled ratio's interval is taken over the blocks' log-ratios, so the
  variation between machines and days is in it, not only within one machine's run.
- An accuracy (a fraction of n questions): the Wilson score interval, which stays inside
  [0, 1] and is sound near 0 and 1 where the normal interval is not; the difference of two
  arms' accuracies: Newcombe's hybrid score interval, from the two Wilson intervals.

With one repeat there is a value and no interval. The t quantiles and the Wilson interval are
scipy's (`scipy.stats.t.ppf`, `scipy.stats.binomtest(...).proportion_ci(method="wilson")`;
scipy comes with SGLang), imported when first needed so the command line starts fast.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

LEVEL = 0.95


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (0 < p < 1)."""
    from scipy import stats

    assert 0.0 < p < 1.0 and df >= 1, (p, df)
    return float(stats.t.ppf(p, df))


@functools.cache
def t975(df: int) -> float:
    """The two-sided 95% quantile t(0.975, df)."""
    return t_quantile(0.975, df)


@dataclass(frozen=True)
class Estimate:
    """A mean over repeats and its t interval (mean +/- ci95)."""

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


@dataclass(frozen=True)
class RatioEstimate:
    """A paired ratio: exp of the mean log-ratio, with exp of its t interval."""

    log_mean: float
    log_ci95: float | None  # half-width on the log scale; None with one block
    n: int  # blocks (the interval's units)
    pairs: int = 0  # paired repeats in all
    blocks: tuple[tuple[int, float, int], ...] = ()  # (block, its ratio, its pairs)

    @property
    def mean(self) -> float:
        """The geometric mean of the paired ratios."""
        return math.exp(self.log_mean)

    @property
    def low(self) -> float | None:
        return None if self.log_ci95 is None else math.exp(self.log_mean - self.log_ci95)

    @property
    def high(self) -> float | None:
        return None if self.log_ci95 is None else math.exp(self.log_mean + self.log_ci95)

    def to_json(self) -> dict[str, float | int | str | None]:
        return {
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "pairs": self.pairs,
            "blocks": [
                {"block": block + 1, "ratio": ratio, "pairs": pairs}
                for block, ratio, pairs in self.blocks
            ],
            "log_mean": self.log_mean,
            "log_ci95": self.log_ci95,
            "method": "geometric mean of paired ratios, exp of the 95% t interval of log ratios "
            "over blocks",
        }


def estimate(values: list[float]) -> Estimate | None:
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Estimate(mean, None, 1)
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Estimate(mean, half, len(values))


def paired_ratio(
    candidate: dict[int, float],
    baseline: dict[int, float],
    block_of: Callable[[int], int] = lambda repeat: repeat,
) -> RatioEstimate | None:
    """Ratio estimate over the repeats both arms finished (values keyed by repeat), pooled over
    the blocks `block_of` puts them in (by default each repeat its own block)."""
    by_block: dict[int, list[float]] = {}
    both = sorted(set(candidate) & set(baseline))
    if any(baseline[r] <= 0 < candidate[r] for r in both):
        return None  # no ratio over a zero baseline (the report shows `-`)
    for r in both:
        if candidate[r] > 0 and baseline[r] > 0:
            by_block.setdefault(block_of(r), []).append(math.log(candidate[r] / baseline[r]))
    means = {block: statistics.fmean(logs) for block, logs in sorted(by_block.items())}
    est = estimate(list(means.values()))
    if est is None:
        return None
    blocks = tuple((b, math.exp(m), len(by_block[b])) for b, m in means.items())
    return RatioEstimate(est.mean, est.ci95, est.n, sum(len(v) for v in by_block.values()), blocks)


def wilson(score: float, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a fraction `score` of `n` trials (score x n correct,
    rounded to whole questions)."""
    from scipy import stats

    assert n >= 1 and 0.0 <= score <= 1.0, (score, n)
    ci = stats.binomtest(round(score * n), n).proportion_ci(LEVEL, method="wilson")
    return float(ci.low), float(ci.high)


def score_difference(a: float, n_a: int, b: float, n_b: int) -> tuple[float, float, float]:
    """The difference a - b of two accuracies (fractions of n_a and n_b questions) with its 95%
    interval: Newcombe's hybrid score interval (his method 10), built from the two Wilson
    intervals, so it stays inside [-1, 1] and is sound near 0 and 1. It treats the two scores
    as independent; for two servers answering the same questions, whose answers agree more
    often than chance, that interval is the wider (conservative) one."""
    low_a, high_a = wilson(a, n_a)
    low_b, high_b = wilson(b, n_b)
    diff = a - b
    low = diff - math.sqrt((a - low_a) ** 2 + (high_b - b) ** 2)
    high = diff + math.sqrt((high_a - a) ** 2 + (b - low_b) ** 2)
    return diff, low, high
