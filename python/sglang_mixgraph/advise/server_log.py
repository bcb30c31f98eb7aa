"""The eager step's host without the profiler, from the server's log (core.prefill_log).

The profiler slows the host it records (every op and launch is an event): an eager MIXED step
that took 283 ms between batches on one H100 took about 393 ms while profiled. SGLang's prefill
batch lines time every step unprofiled outside a profile. The median gap of the back-to-back
eager MIXED batches just before the profile against the median inside it is the factor by which
the profiler stretched the host; the profile's own lines ("Profiling starts ... (with profile
id: ID)", "Stop profiling") mark the window. With the load's whole burst in the log and the
client's benchmark duration, the burst splits into its prefill phase (the batches' gaps, those
inside the profile priced by the factor) and the rest (the decode after the last prefill batch,
and the requests' wait before the first): a prefill step's change moves the time per output
token by about the prefill share of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sglang_mixgraph.advise.steps import med
from sglang_mixgraph.core.prefill_log import Batch, back_to_back_gaps, parse_batch

MIN_BATCHES = 4  # fewer gaps than this on either side give no factor

_START = re.compile(r"Profiling starts.*\(with profile id: (?P<id>[^)]+)\)")
_STOP = "Stop profiling"


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


def _around(text: str, profile_id: str):
    """The log's prefill batches by their place around the profile: ("before" | "inside" |
    "after", batch), and the events ("start", None), ("stop", None) for this profile and
    ("earlier stop", None) for another one's stop before it."""
    place = "before"
    for line in text.splitlines():
        if place == "before" and (m := _START.search(line)) and m["id"].strip() == profile_id:
            place = "inside"
            yield "start", None
        elif place != "after" and _STOP in line:
            yield ("stop" if place == "inside" else "earlier stop"), None
            place = "after" if place == "inside" else place
        elif (b := parse_batch(line)) is not None:
            yield place, b


def windows(text: str, profile_id: str) -> tuple[list[Batch], list[Batch]] | None:
    """(batches before the profile, batches inside it), or None where the log does not hold
    that profile's start. "Before" starts after any earlier profile's stop."""
    before: list[Batch] = []
    during: list[Batch] | None = None
    for place, b in _around(text, profile_id):
        if place == "earlier stop":
            before = []
        elif place == "start":
            during = []
        elif place == "before":
            before.append(b)
        elif place == "inside":
            during.append(b)
        elif place == "stop":
            break
    return None if during is None else (before, during)


def host_scale(text: str, profile_id: str, last: int = 64) -> HostScale | str:
    """The profiler's factor on the eager MIXED host, or why the log gives none (a phrase)."""
    found = windows(text, profile_id)
    if found is None:
        return f"the log does not show profile {profile_id} starting"
    before, during = found
    unprofiled, profiled = back_to_back_gaps(before)[-last:], back_to_back_gaps(during)
    if len(unprofiled) < MIN_BATCHES or len(profiled) < MIN_BATCHES:
        return (
            f"the log has {len(unprofiled)} back-to-back eager MIXED batches before the profile "
            f"and {len(profiled)} in it (at least {MIN_BATCHES} each are needed)"
        )
    return HostScale(med(unprofiled), med(profiled), len(unprofiled), len(profiled))


@dataclass(frozen=True)
class ServedShare:
    """The load's burst: its prefill phase priced unprofiled, and the rest of the client's
    benchmark duration (the decode after the last prefill batch, and any wait before the first:
    ``tail_s``, ``decode_tail_s`` in the JSON)."""

    prefill_s: float
    tail_s: float
    batches: int  # prefill batches timed

    @property
    def share(self) -> float:
        return self.prefill_s / (self.prefill_s + self.tail_s)

    def to_json(self) -> dict:
        return {
            "prefill_s": self.prefill_s,
            "decode_tail_s": self.tail_s,
            "prefill_batches": self.batches,
            "prefill_share": self.share,
        }


def served_share(
    text: str, profile_id: str, scale: HostScale, duration_s: float
) -> ServedShare | str:
    """`text`: the log from just before the burst's first batch to its end. The first batch's
    gap is the idle time before the burst and is left out; the profiled batches' gaps are
    scaled by the host factor; the first gap after the profile holds SGLang's trace export
    (seconds the scheduler stood still: 14 s on one H100), which unprofiled serving does not
    have, so it leaves the duration and counts as one median step. Why there is no share,
    where there is none (a phrase)."""
    outside: list[float] = []
    inside: list[float] = []
    export = None
    seen, stopped = 0, False
    for place, b in _around(text, profile_id):
        stopped |= place == "stop"
        if b is None:
            continue
        seen += 1
        if seen == 1 or b.gap_ms is None:
            continue
        if place == "after" and export is None:
            export = b.gap_ms / 1000
        else:
            (inside if place == "inside" else outside).append(b.gap_ms / 1000)
    if not stopped:
        return f"the log does not show profile {profile_id} starting and stopping"
    timed = len(outside) + len(inside) + (export is not None)
    if len(outside) + len(inside) < MIN_BATCHES:
        return f"the log has {timed} timed prefill batches of the burst (at least {MIN_BATCHES})"
    spent = sum(outside) + sum(inside) + (export or 0.0)
    tail = duration_s - spent
    if tail <= 0:
        return (
            f"the burst's prefill batches span {spent:.1f} s, not less than the client's "
            f"{duration_s:.1f} s benchmark: other traffic shared the server"
        )
    step = med([*outside, *(g * scale.factor for g in inside)]) if export is not None else 0.0
    return ServedShare(sum(outside) + sum(inside) * scale.factor + step, tail, timed)
