"""SGLang's prefill batch lines, read back from a server's log: every prefill step, timed.

SGLang logs every prefill batch, a MIXED step included
(`SchedulerMetricsReporter.report_prefill_stats`,
`sglang.srt.managers.scheduler_components.metrics_reporter`): `#new-token`, `#running-req`,
`#queue-req`, `cuda graph: True/False` (whether the step replayed a prefill graph) and `input
throughput (token/s)`, which is those tokens over the time since the previous prefill batch's
line. Between two back-to-back prefill batches (requests still queued at the first, so no
decode-only step ran between them) that time is one step, timed without any profiler. `advise`
reads it to price the eager host unprofiled; `ab` to say what each visit's steps cost. With
`--decode-log-interval 1` SGLang also logs every decode step (`report_decode_stats`: `#running-req`
over `gen throughput`), which splits a served burst into its prefill phase and the decode tail
after it: the share a faster prefill step can shorten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from statistics import median

TAIL_BYTES = 64 << 20  # a long-running server's log: read its last 64 MiB

_BATCH = re.compile(
    r"Prefill batch(?: \[\d+\])?, #new-seq: \d+, #new-token: (?P<tokens>\d+),.*?"
    r"#running-req: (?P<running>\d+), #queue-req: (?P<queued>\d+),.*?"
    r"(?:\w+ )?graph: (?P<graph>True|False),.*?"
    r"input throughput \(token/s\): (?P<throughput>[0-9.]+)"
)


_DECODE = re.compile(
    r"Decode batch(?: \[\d+\])?, #running-req: (?P<running>\d+),.*?"
    r"gen throughput \(token/s\): (?P<throughput>[0-9.]+)"
)


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


def parse_batch(line: str) -> Batch | None:
    m = _BATCH.search(line)
    if m is None:
        return None
    tokens, throughput = int(m["tokens"]), float(m["throughput"])
    gap = tokens / throughput * 1000 if tokens and throughput > 0 else None
    return Batch(tokens, int(m["running"]), int(m["queued"]), m["graph"] == "True", gap)


def batches(text: str) -> list[Batch]:
    return [b for line in text.splitlines() if (b := parse_batch(line)) is not None]


def read_tail(path: Path, offset: int = 0) -> str:
    """The log from `offset` on (at most its last TAIL_BYTES), as text."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(max(offset, size - TAIL_BYTES))
        return f.read().decode("utf-8", "replace")


def back_to_back_gaps(seq: list[Batch], *, replayed: bool = False) -> list[float]:
    """The gaps of the MIXED batches (eager ones, or replayed ones) that followed a batch with
    requests still queued; the sequence's first batch has no predecessor and is left out."""
    return [
        b.gap_ms
        for prev, b in zip(seq, seq[1:], strict=False)
        if prev.queued > 0 and b.mixed and b.replayed == replayed and b.gap_ms is not None
    ]


def step_summary(text: str) -> dict:
    """What a server's log says of its prefill steps: how many, how many replayed and MIXED,
    and the median time between back-to-back MIXED steps, eager and replayed (None: none)."""
    seq = batches(text)
    summary = {
        "prefill_batches": len(seq),
        "replayed": sum(b.replayed for b in seq),
        "mixed": sum(b.mixed for b in seq),
    }
    for kind, replayed in (("eager", False), ("replayed", True)):
        gaps = back_to_back_gaps(seq, replayed=replayed)
        summary[f"{kind}_mixed_apart_ms"] = median(gaps) if gaps else None
        summary[f"{kind}_mixed_timed"] = len(gaps)
    return summary


@dataclass
class Burst:
    """A stretch of serving from a prefill batch that started from idle (no request running)
    to the next: its prefill batches, and the decode-only steps after the last of them (ms,
    each `#running-req` over `gen throughput`, which holds at a decode log interval of 1)."""

    prefills: list[Batch]
    tail_ms: list[float]

    @property
    def prefill_tokens(self) -> int:
        return sum(b.tokens for b in self.prefills)

    @property
    def prefill_phase_s(self) -> float:
        """The gaps of its prefill batches after the first (the first one's is the idle time
        before the burst); decode steps between two prefill batches lie inside these gaps."""
        return sum(b.gap_ms for b in self.prefills[1:] if b.gap_ms) / 1000

    @property
    def tail_s(self) -> float:
        """The decode tail; its first step's line is left out: SGLang times a decode line
        from the previous decode line, so that one's gap spans the whole prefill phase."""
        return sum(self.tail_ms[1:]) / 1000

    @property
    def prefill_share(self) -> float | None:
        whole = self.prefill_phase_s + self.tail_s
        return self.prefill_phase_s / whole if whole > 0 else None


def bursts(text: str) -> list[Burst]:
    found: list[Burst] = []
    for line in text.splitlines():
        batch = parse_batch(line)
        if batch is not None:
            if batch.running == 0 and (not found or found[-1].tail_ms):
                found.append(Burst([batch], []))
            elif found:
                found[-1].tail_ms.clear()  # those decode steps were inside the next gap
                found[-1].prefills.append(batch)
        elif found and (m := _DECODE.search(line)):
            running, throughput = int(m["running"]), float(m["throughput"])
            found[-1].tail_ms.append(running / throughput * 1000 if throughput > 0 else 0.0)
    return found
