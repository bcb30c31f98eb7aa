"""The eager step's host without the profiler: SGLang's own prefill batch lines in its log.

The profiler slows the host it records (every op and launch is an event): an eager MIXED step
that took 283 ms between batches on one H100 took about 393 ms while profiled. SGLang logs every
prefill batch, a MIXED step included (`SchedulerMetricsReporter.report_prefill_stats`):
`#new-token`, `#running-req`, `#queue-req`, `cuda graph: True/False` and `input throughput
(token/s)`, which is those tokens over the time since the previous prefill batch's line. Between
two back-to-back prefill batches (requests still queued at the first) that time is one step.
The median of those gaps just before the profile against the median inside it is the factor
by which the profiler stretched the host; the profile's own lines ("Profiling starts ... (with
profile id: ID)", "Stop profiling") mark the window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sglang_mixgraph.advise.steps import med

MIN_BATCHES = 4  # fewer gaps than this on either side give no factor
TAIL_BYTES = 64 << 20  # a long-running server's log: read its last 64 MiB

_BATCH = re.compile(
    r"Prefill batch(?: \[\d+\])?, #new-seq: \d+, #new-token: (?P<tokens>\d+),.*?"
    r"#running-req: (?P<running>\d+), #queue-req: (?P<queued>\d+),.*?"
    r"(?:\w+ )?graph: (?P<graph>True|False),.*?"
    r"input throughput \(token/s\): (?P<throughput>[0-9.]+)"
)
_START = re.compile(r"Profiling starts.*\(with profile id: (?P<id>[^)]+)\)")
_STOP = "Stop profiling"


@dataclass(frozen=True)
class Batch:
    tokens: int
    running: int  # requests decoding beside the chunk: more than 0 makes it a MIXED step
    queued: int
    replayed: bool
    gap_ms: float | None  # since the previous prefill batch's line; None where not logged

    @property
    def mixed(self) -> bool:
        return self.running > 0


@dataclass(frozen=True)
class HostScale:
    """Eager MIXED steps' time between batches, unprofiled and profiled, from the log."""

    unprofiled_ms: float
    profiled_ms: float
    unprofiled_batches: int
    profiled_batches: int

    @property
    def factor(self) -> float:
        return self.unprofiled_ms / self.profiled_ms

    def to_json(self) -> dict:
        return {
            "unprofiled_ms": self.unprofiled_ms,
            "profiled_ms": self.profiled_ms,
            "unprofiled_batches": self.unprofiled_batches,
            "profiled_batches": self.profiled_batches,
            "factor": self.factor,
        }


def read_tail(path: Path, offset: int = 0) -> str:
    """The log from `offset` on (at most its last TAIL_BYTES), as text."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(max(offset, size - TAIL_BYTES))
        return f.read().decode("utf-8", "replace")


def parse_batch(line: str) -> Batch | None:
    m = _BATCH.search(line)
    if m is None:
        return None
    tokens, throughput = int(m["tokens"]), float(m["throughput"])
    gap = tokens / throughput * 1000 if tokens and throughput > 0 else None
    return Batch(tokens, int(m["running"]), int(m["queued"]), m["graph"] == "True", gap)


def mixed_batches(text: str) -> int:
    """How many MIXED prefill batches the text logs (the load's progress)."""
    return sum(1 for line in text.splitlines() if (b := parse_batch(line)) and b.mixed)


def _back_to_back_gaps(batches: list[Batch]) -> list[float]:
    """Gaps of eager MIXED batches that followed a batch with requests still queued (so no
    decode-only step ran between the two lines); the window's first line has no such
    predecessor inside it and is left out."""
    return [
        b.gap_ms
        for prev, b in zip(batches, batches[1:], strict=False)
        if prev.queued > 0 and b.mixed and not b.replayed and b.gap_ms is not None
    ]


def windows(text: str, profile_id: str) -> tuple[list[Batch], list[Batch]] | None:
    """(batches before the profile, batches inside it), or None where the log does not hold
    that profile's start. "Before" starts after any earlier profile's stop."""
    before: list[Batch] = []
    during: list[Batch] | None = None
    for line in text.splitlines():
        if during is None:
            if (m := _START.search(line)) and m["id"].strip() == profile_id:
                during = []
            elif _STOP in line:
                before = []
            elif b := parse_batch(line):
                before.append(b)
        elif _STOP in line:
            break
        elif b := parse_batch(line):
            during.append(b)
    return None if during is None else (before, during)


def host_scale(text: str, profile_id: str, last: int = 64) -> HostScale | str:
    """The profiler's factor on the eager MIXED host, or why the log gives none (a phrase)."""
    found = windows(text, profile_id)
    if found is None:
        return f"the log does not show profile {profile_id} starting"
    before, during = found
    unprofiled, profiled = _back_to_back_gaps(before)[-last:], _back_to_back_gaps(during)
    if len(unprofiled) < MIN_BATCHES or len(profiled) < MIN_BATCHES:
        return (
            f"the log has {len(unprofiled)} back-to-back eager MIXED batches before the profile "
            f"and {len(profiled)} in it (at least {MIN_BATCHES} each are needed)"
        )
    return HostScale(med(unprofiled), med(profiled), len(unprofiled), len(profiled))
