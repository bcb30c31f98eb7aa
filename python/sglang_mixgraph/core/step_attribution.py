"""Where a replayed step's GPU time goes, against the same step run eagerly, from two torch
profiler traces (chrome JSON) of one forward each. Reads nothing but the traces.

A breakable-graph replay launches its segments with ``cudaGraphLaunch`` and runs eager breaks
between them; an eager step launches every kernel itself, so the two traces' classes by launch
frame do not compare (``core.kernel_classes`` classes a graph's kernels by name only). Here the
two runs' kernels are paired in execution order by what they are (their name; GEMMs as one kind,
since cuBLAS picks other tiles at another M): a matched pair is the same work, and takes the
eager kernel's class; what stays unmatched is what only one run does (the replay's copies into
the buffers its segments read, work on padded rows, the eager step's own fills). Every GPU op
of the replay is placed: before the first segment (the replay's prepare), in segment i, or in
the break after segment i. Used by ``tools/rank-slice/step_attribution.py``.
"""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from dataclasses import dataclass

from sglang_mixgraph.core.kernel_classes import (
    FLASHMLA,
    GEMM_NAME,
    LAUNCH_CATS,
    gpu_events,
    launch_frames,
)

GRAPH_LAUNCH = "cudaGraphLaunch"
_COPY = re.compile(r"^(Memcpy \w+|Memset)")


@dataclass(frozen=True)
class GpuOp:
    """One kernel, copy or memset of a traced step, in execution order."""

    ts: float
    name: str
    ms: float
    cls: str  # core.kernel_classes' class from the op's own trace
    nbytes: int | None  # copies and memsets
    place: str  # "eager", "prepare", "segment i", "break i", "after"
    kind: str  # what pairs it with the other run's op (see `kind_of`)


def kind_of(name: str) -> str:
    """What an op is, for pairing: copies and memsets by direction, GEMMs as one kind, other
    kernels by their full name up to the argument list."""
    m = _COPY.match(name)
    if m:
        return m.group(1)
    if GEMM_NAME.search(name) and not FLASHMLA.search(name):
        return "gemm"
    return name.split("(", 1)[0][:200]


def gpu_ops(events: list) -> list[GpuOp]:
    """The step's GPU ops in start order, each placed relative to the graph launches."""
    launches = {}
    for ev in events:
        if ev.get("cat") in LAUNCH_CATS and "correlation" in ev.get("args", {}):
            launches[ev["args"]["correlation"]] = (ev["name"], float(ev["ts"]))
    graph_ts = sorted(ts for name, ts in launches.values() if name.startswith(GRAPH_LAUNCH))
    segment_of = {
        corr: graph_ts.index(ts)
        for corr, (name, ts) in launches.items()
        if name.startswith(GRAPH_LAUNCH)
    }
    ops = []
    for ev, cls, _ in gpu_events(events, launch_frames(events)):
        corr = ev.get("args", {}).get("correlation")
        if corr in segment_of:
            place = f"segment {segment_of[corr]}"
        elif not graph_ts:
            place = "eager"
        else:
            launched = launches.get(corr, (None, float(ev["ts"])))[1]
            # launched after `before` segments: the prepare, the break after segment
            # before - 1, or after the last segment
            before = sum(ts < launched for ts in graph_ts)
            if before == 0:
                place = "prepare"
            elif before == len(graph_ts):
                place = "after"
            else:
                place = f"break {before - 1}"
        nbytes = ev.get("args", {}).get("bytes")
        ops.append(
            GpuOp(
                ts=float(ev["ts"]),
                name=ev["name"],
                ms=float(ev["dur"]) / 1e3,
                cls=cls,
                nbytes=int(nbytes) if isinstance(nbytes, int | float) else None,
                place=place,
                kind=kind_of(ev["name"]),
            )
        )
    ops.sort(key=lambda op: op.ts)
    return ops


def _place_kind(place: str) -> str:
    return place.split(" ", 1)[0]


def _group(ops: list[GpuOp]) -> list[dict]:
    """Ops of one kind summed: count, ms, bytes, class, where they ran; the largest first."""
    by = defaultdict(list)
    for op in ops:
        by[op.kind].append(op)
    rows = []
    for kind, group in by.items():
        places = defaultdict(int)
        for op in group:
            places[_place_kind(op.place)] += 1
        sizes = [op.nbytes for op in group if op.nbytes is not None]
        rows.append(
            {
                "kind": kind,
                "class": group[0].cls,
                "count": len(group),
                "ms": round(sum(op.ms for op in group), 3),
                "bytes": sum(sizes) if sizes else None,
                "places": dict(places),
            }
        )
    return sorted(rows, key=lambda r: -r["ms"])


def attribute(eager_events: list, replay_events: list, top: int = 12) -> dict:
    """The replay's GPU time against the eager step's: matched work by the eager kernel's class,
    the ops only one run has, and the replay's time by place. ``delta_ms`` equals the matched
    delta plus the replay-only ms minus the eager-only ms."""
    eager, replay = gpu_ops(eager_events), gpu_ops(replay_events)
    matcher = difflib.SequenceMatcher(
        None, [op.kind for op in eager], [op.kind for op in replay], autojunk=False
    )
    pairs, eager_only, replay_only = [], [], []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs += zip(eager[i1:i2], replay[j1:j2], strict=True)
        else:
            eager_only += eager[i1:i2]
            replay_only += replay[j1:j2]
    by_class = defaultdict(lambda: {"count": 0, "eager_ms": 0.0, "replay_ms": 0.0})
    by_kind = defaultdict(lambda: {"count": 0, "eager_ms": 0.0, "replay_ms": 0.0})
    for e, r in pairs:
        for row in (by_class[e.cls], by_kind[e.kind]):
            row["count"] += 1
            row["eager_ms"] += e.ms
            row["replay_ms"] += r.ms
    places = defaultdict(float)
    for op in replay:
        places[_place_kind(op.place)] += op.ms

    def rounded(row: dict) -> dict:
        return {
            "count": row["count"],
            "eager_ms": round(row["eager_ms"], 3),
            "replay_ms": round(row["replay_ms"], 3),
            "delta_ms": round(row["replay_ms"] - row["eager_ms"], 3),
        }

    changes = sorted(by_kind.items(), key=lambda kv: -abs(kv[1]["replay_ms"] - kv[1]["eager_ms"]))
    eager_ms, replay_ms = sum(op.ms for op in eager), sum(op.ms for op in replay)
    return {
        "eager_ms": round(eager_ms, 3),
        "replay_ms": round(replay_ms, 3),
        "delta_ms": round(replay_ms - eager_ms, 3),
        "ops": {"eager": len(eager), "replay": len(replay), "matched": len(pairs)},
        "matched_by_class": {c: rounded(row) for c, row in sorted(by_class.items())},
        "matched_changes": [{"kind": k, **rounded(row)} for k, row in changes[:top]],
        "replay_only": _group(replay_only)[:top],
        "replay_only_ms": round(sum(op.ms for op in replay_only), 3),
        "eager_only": _group(eager_only)[:top],
        "eager_only_ms": round(sum(op.ms for op in eager_only), 3),
        "replay_by_place": {p: round(ms, 3) for p, ms in sorted(places.items())},
        "segments": len({op.place for op in replay if op.place.startswith("segment")}),
    }
