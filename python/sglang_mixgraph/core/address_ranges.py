"""Sorted device address ranges: is a tensor's memory inside a set of allocator segments?

The break-input patch asks, for each tensor a breakable graph's eager break receives during
capture, whether its bytes lie in the graph memory pool (a segment list read from torch's
allocator snapshot) or elsewhere (the ordinary allocator, a parameter, a static buffer).
Ranges are half-open ``[start, start + size)``; a span counts as inside only when one range
holds all of it. No torch or sglang import: the snapshot is read by the caller.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable


class AddressRanges:
    """Non-overlapping ``(start, size)`` ranges, searchable by address."""

    def __init__(self, ranges: Iterable[tuple[int, int]]):
        spans = sorted((int(s), int(n)) for s, n in ranges if int(n) > 0)
        for (s0, n0), (s1, _) in zip(spans, spans[1:], strict=False):
            if s0 + n0 > s1:
                raise ValueError(f"overlapping ranges at {s0:#x}+{n0} and {s1:#x}")
        self._starts = [s for s, _ in spans]
        self._ends = [s + n for s, n in spans]

    def __len__(self) -> int:
        return len(self._starts)

    def holds(self, address: int, nbytes: int) -> bool:
        """True when ``[address, address + nbytes)`` lies in one range (empty spans: at address)."""
        i = bisect.bisect_right(self._starts, address) - 1
        return i >= 0 and address + max(nbytes, 1) <= self._ends[i]
