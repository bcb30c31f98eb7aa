"""How many compress rows a DeepSeek-V4 compressor prefill plan can need at most.

A request with ``seq`` tokens of which the last ``extend`` are new compresses once for every
position p in [seq - extend, seq) with (p + 1) % r == 0: ``seq // r - (seq - extend) // r``
events, at most ceil(extend / r). Over a batch of B requests whose extends sum to at most N
rows, that is at most floor((N + (r - 1) * B) / r) events, and never more than N. A plan
captured at N rows therefore needs only that many compress rows for any batch of at most
``max_batch`` requests. Pure integers, no SGLang import.
"""

from __future__ import annotations

from collections.abc import Iterable


def batch_bound(rows: int, *limits: int | None) -> int:
    """The most requests a batch of ``rows`` query rows can hold: every request brings at least
    one row, and each known limit (the request pool's size, the backend's graph batch limit)
    bounds it too; None limits are unknown."""
    return min([rows] + [int(x) for x in limits if x is not None])


def plan_cap(rows: int, ratio: int, max_batch: int) -> int:
    """The compress rows a plan of ``rows`` rows keeps for batches of at most ``max_batch``
    requests at compress ratio ``ratio``."""
    if rows <= 0:
        return rows
    if ratio < 1 or max_batch < 0:
        raise ValueError(f"ratio {ratio} and max_batch {max_batch} must be >= 1 and >= 0")
    return min(rows, (rows + (ratio - 1) * max_batch) // ratio)


def compress_events(seq_lens: Iterable[int], extend_lens: Iterable[int], ratio: int) -> int:
    """The compress plan's valid rows for a batch: its requests' compress events at ``ratio``."""
    total = 0
    for seq, extend in zip(seq_lens, extend_lens, strict=True):
        total += seq // ratio - (seq - extend) // ratio
    return total
