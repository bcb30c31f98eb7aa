"""The compress plan cap against a brute-force count of compress events: random batches within
the bound never exceed it, and the worst batch at the bound reaches it exactly."""

from __future__ import annotations

import random

import pytest

from sglang_mixgraph.core.compress_events import batch_bound, compress_events, plan_cap


def brute_force_events(seq_lens, extend_lens, ratio) -> int:
    """Every position of every request's new tokens that closes a compress window."""
    return sum(
        1
        for seq, extend in zip(seq_lens, extend_lens, strict=True)
        for p in range(seq - extend, seq)
        if (p + 1) % ratio == 0
    )


def random_batch(rng, rows, max_batch):
    """A batch of at most ``max_batch`` requests whose new tokens fill at most ``rows`` rows:
    a mix of one-token (decode) rows, short extends and long prefills, random prefixes."""
    n = rng.randint(1, min(rows, max_batch))
    budget = rng.randint(n, rows)
    extends = [1] * n
    for _ in range(budget - n):
        extends[rng.randrange(n) if rng.random() < 0.7 else 0] += 1
    rng.shuffle(extends)
    prefixes = [rng.choice([0, rng.randrange(4096), 127, 3, 255]) for _ in extends]
    return [p + e for p, e in zip(prefixes, extends, strict=True)], extends


@pytest.mark.parametrize("ratio", [4, 128])
@pytest.mark.parametrize(
    "rows, max_batch", [(2816, 272), (256, 256), (64, 3), (1, 1), (8192, 1024)]
)
def test_random_batches_stay_within_the_cap(ratio, rows, max_batch):
    rng = random.Random(rows * 131 + ratio + max_batch)
    cap = plan_cap(rows, ratio, max_batch)
    worst = 0
    for _ in range(400):
        seq, ext = random_batch(rng, rows, max_batch)
        events = brute_force_events(seq, ext, ratio)
        assert compress_events(seq, ext, ratio) == events
        assert events <= cap, (seq, ext)
        worst = max(worst, events)
    assert 1 <= cap <= rows


def worst_batch(rows, ratio, n):
    """n requests that each start on a window's last position: n - 1 one-token rows and one
    long extend over the rest, so every request compresses ceil(extend / ratio) times."""
    extends = [1] * (n - 1) + [rows - (n - 1)]
    prefixes = [ratio - 1] * n
    return [p + e for p, e in zip(prefixes, extends, strict=True)], extends


@pytest.mark.parametrize("ratio", [4, 128])
@pytest.mark.parametrize("rows, max_batch", [(2816, 272), (512, 8), (300, 300), (129, 2)])
def test_the_worst_batch_at_the_bound_reaches_the_cap(ratio, rows, max_batch):
    seq, ext = worst_batch(rows, ratio, max_batch)
    assert sum(ext) == rows and len(ext) == max_batch
    events = brute_force_events(seq, ext, ratio)
    assert events == plan_cap(rows, ratio, max_batch)
    # ``ratio`` more requests than the bound overflow a cap that keeps fewer rows than the plan.
    if plan_cap(rows, ratio, max_batch) < rows and max_batch + ratio <= rows:
        seq, ext = worst_batch(rows, ratio, max_batch + ratio)
        assert brute_force_events(seq, ext, ratio) == plan_cap(rows, ratio, max_batch) + ratio - 1


def test_the_worked_example_of_the_step():
    # 2816-row bucket, 272 request slots: c128 keeps 291 of 2816 rows, c4 908.
    assert plan_cap(2816, 128, 272) == 291
    assert plan_cap(2816, 4, 272) == 908


def test_bounds_and_degenerate_plans():
    assert batch_bound(2816, 272, None) == 272
    assert batch_bound(100, 272, 1024) == 100
    assert batch_bound(2816, 272, 64) == 64
    assert plan_cap(0, 128, 4) == 0
    assert plan_cap(10, 1, 4) == 10
    with pytest.raises(ValueError):
        plan_cap(10, 0, 4)
